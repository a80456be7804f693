from bench.tradeoff.experiment import main
from pipeline.stage import stage

raise SystemExit(stage(main, who="bench.tradeoff"))
