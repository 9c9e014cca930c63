#!/bin/bash
# Held-out ShareGPT decoding (the shipping criterion): each fine-tune of train.sh beside the shipped checkpoint,
# and the three draft vocabularies of the BPD heads (tau and drafting time per step), one bench run each.
set -e
common="--questions sharegpt --per-category 20 --max-new-tokens 128 --threads 2 --no-compile"
blockdraft bench $common --out runs/sd2-heldout-heads --methods \
ar,bpd,bpd:checkpoint=runs/bpd-sd2,bpd:checkpoint=runs/bpd-sd2-vocab16384,bpd:checkpoint=runs/bpd-sd2-vocab0,\
hydra,hydra:checkpoint=runs/bpd-sd2:module=runs/hydra-sd2,hybrid,hybrid:checkpoint=runs/bpd-sd2:module=runs/hydra-sd2
blockdraft bench $common --out runs/sd2-heldout-block --methods \
ar,dflash,dflash:checkpoint=runs/dflash-sd2,treeflash,treeflash:checkpoint=runs/dflash-sd2:module=runs/treeflash-sd2
