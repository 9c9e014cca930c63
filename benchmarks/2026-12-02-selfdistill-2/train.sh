#!/bin/bash
# The second and third self-distilled fine-tunes (2026-12-02, night), and the draft-vocabulary re-measure of
# issue 14: the BPD heads fine-tuned at 8k (the checkpoint's), 16k and the full vocabulary for the same minutes
# on the same data (`train --init --draft-vocab` grows a checkpoint's vocabulary).
set -e
D=benchmarks/2026-12-02-selfdistill-2
# Second round: the 2,864 conversations written after the first fine-tunes (lines past 1,819).
bash $D/finetune.sh 1820 sd2
CK=src/blockdraft/checkpoints/smollm2-135m  # as shipped before the second round
for vocab in 16384 0; do
  blockdraft train --data runs/sd/part-sd2.jsonl --store runs/store-sd2 --max-tokens 2000000 --lr 3e-4 --epochs 2 \
    --threads 2 --drafter heads --init $CK/bpd --draft-vocab $vocab --max-minutes 6 --out runs/bpd-sd2-vocab$vocab
done
# Third round, after shipping the second: the conversations written after it (lines past 4,693).
bash $D/finetune.sh 4694 sd3
