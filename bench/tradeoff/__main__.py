from bench.tradeoff.experiment import main
from pipeline.stage import STUDY_STOPPED, stage

raise SystemExit(stage(main, who="bench.tradeoff", stopped=STUDY_STOPPED))
