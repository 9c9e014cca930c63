#!/bin/bash
# Held-out ShareGPT decoding for the third fine-tunes (finetune.sh 4694 sd3, in train.sh) beside the shipped checkpoints (the second).
set -e
common="--questions sharegpt --per-category 20 --max-new-tokens 128 --threads 2 --no-compile"
blockdraft bench $common --out runs/sd3-heldout --methods \
ar,bpd,bpd:checkpoint=runs/bpd-sd3,hydra,hydra:checkpoint=runs/bpd-sd3:module=runs/hydra-sd3,\
hybrid,hybrid:checkpoint=runs/bpd-sd3:module=runs/hydra-sd3,\
dflash,dflash:checkpoint=runs/dflash-sd3,treeflash,treeflash:checkpoint=runs/dflash-sd3:module=runs/treeflash-sd3
# Then the hybrid's learned drafter with 4 parents per depth, and treeflash's module on the new block drafter.
# (`hybrid` is parents=8, the default.)
blockdraft bench $common --out runs/sd3-heldout-2 --methods \
ar,suffix,hybrid,hybrid:parents=4,hybrid:parents=4:children=4,treeflash,treeflash:checkpoint=runs/dflash-sd3,\
treeflash:checkpoint=runs/dflash-sd3:module=runs/treeflash-sd3
