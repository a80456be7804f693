#!/usr/bin/env bash
# Table 2 at CPU scale: timm's VGG16 (a width-16 miniature) AB and DDP, and the default
# mini-ViT (AB) for contrast, on the CIFAR-10 subset of profiles/table2.yaml; 2 nodes x 1
# rank on this machine (gloo). Then the report's JSON and figure (bench/table2.py).
# Every run reads profiles/table2.yaml; only method (and model, for the mini-ViT) differ.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CFG=profiles/table2.yaml
OUT=${TABLE2_RUNS:-runs/table2}
# the default mini-ViT of params.yaml: timm's VisionTransformer, width 192
VIT="model={name: python, factory: timm.models.vision_transformer:VisionTransformer, kwargs: {img_size: 32, patch_size: 8, embed_dim: 192, depth: 6, num_heads: 6, mlp_ratio: 4.0, qkv_bias: false, drop_path_rate: 0.0}, init: ortho_sigma}"
mkdir -p "$OUT"

$PY -m abtrain prepare --config $CFG
run() {  # name, then --set overrides
    local name=$1; shift
    local sets=()
    for s in "$@"; do sets+=(--set "$s"); done
    $PY -m abtrain.launch --nnodes 2 --nproc-per-node 1 \
        train --config $CFG "${sets[@]}" --out "$OUT/$name" 2>&1 | tee "$OUT/$name.log"
}
run vgg16-ab method=ab
run vgg16-ddp method=ddp
run vit-ab method=ab "$VIT"
# supplementary: VGG16 AB with AdamW's cumulative decay exp(-wd * sum lr) of the paper's
# 15,000 steps (~0.1) packed into these 1,500 (wd 3.6 instead of 0.1; see the report)
run vgg16-ab-wd method=ab optim.weight_decay=3.6
run vgg16-ddp-wd method=ddp optim.weight_decay=3.6

$PY -m bench.table2 --runs "$OUT" --out reports/table2
