#!/bin/bash
# The second self-distilled fine-tunes (2026-12-02, night): on the conversations `blockdraft selfdistill` wrote
# after the first fine-tunes (lines past 1,819 of its file), each drafter from its shipped checkpoint; and the
# draft-vocabulary re-measure of issue 14: the BPD heads fine-tuned at 8k (the checkpoint's), 16k and the full
# vocabulary for the same minutes on the same data. The first command builds the feature stores.
set -e
SD=runs/sd/sharegpt-smollm2-sd.jsonl
D=runs/sd/sd-part2.jsonl
tail -n +1820 $SD > $D
CK=src/blockdraft/checkpoints/smollm2-135m
run() { blockdraft train --data $D --store runs/store-sd2 --max-tokens 2000000 --lr 3e-4 --epochs 2 --threads 2 "$@"; }
run --drafter heads --init $CK/bpd --max-minutes 6 --out runs/bpd-sd2
run --drafter heads --init $CK/bpd --draft-vocab 16384 --max-minutes 6 --out runs/bpd-sd2-16k
run --drafter heads --init $CK/bpd --draft-vocab 0 --max-minutes 6 --out runs/bpd-sd2-full
run --drafter treeflash --init runs/bpd-sd2 --init-module $CK/hydra --max-minutes 7 --out runs/hydra-sd2
run --drafter block --init $CK/dflash --max-minutes 10 --out runs/dflash-sd2
run --drafter treeflash --init runs/dflash-sd2 --init-module $CK/treeflash --max-minutes 7 --out runs/treeflash-sd2
