#!/usr/bin/env bash
# Build what run.sh needs on the GPU machine, in folders the device tool carries one per call (64 MiB a call,
# with the checkout; move src/blockdraft/checkpoints and the other benchmark folders out of the checkout for the
# calls, and `git reset` after putting them back):
#   .gpu/a  the GGUF's first 65 MB                                   (call 1: run.sh stash, SMOKE=1)
#   .gpu/b  the rest of it, its sha256, the gguf wheel, the shipped dflash and treeflash checkpoints   (call 2: stash)
#   .gpu/c  the shipped bpd and hydra checkpoints and ShareGPT (subset.py)                 (call 3: run.sh full)
# PROMPTS_ONLY=1 (the default) packs only first human turns, for SD_MINUTES > 0; PROMPTS_ONLY=0 packs RECORDS
# whole conversations to train on ShareGPT's own replies (2026-12-04's run, commit bcbcb93, in two calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
G=.gpu
CK=src/blockdraft/checkpoints/smollm2-135m
rm -rf $G && mkdir -p $G/a $G/b/wheels $G/b/init $G/c/init
gguf=$(python -c "from blockdraft.target.loading import resolve_target; print(resolve_target().path)")
split -b 65000000 -a 2 "$gguf" $G/gguf.part.
mv $G/gguf.part.aa $G/a/ && mv $G/gguf.part.ab $G/b/
sha256sum "$gguf" | cut -d' ' -f1 > $G/b/gguf.sha256
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d $G/b/wheels 'gguf>=0.10'
cp -r $CK/dflash $CK/treeflash $G/b/init/
cp -r $CK/bpd $CK/hydra $G/c/init/
if [ "${PROMPTS_ONLY:-1}" = 1 ]; then
    python benchmarks/2026-12-04-gpu/subset.py $G/c/sharegpt.json.xz --records 20000 --prompts-only
else
    python benchmarks/2026-12-04-gpu/subset.py $G/c/sharegpt.json.xz --records "${RECORDS:-4400}"
fi
# each call carries the checkout too (once the checkpoints and the other benchmark folders are moved out, as in
# README.md here): say now if a call would be refused (64 MiB)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | grep -zv "^src/blockdraft/checkpoints/" |
    grep -zv "^benchmarks/[^/]*/" | xargs -0 du -cb | awk 'END {print $1}')
tree=$(( tree + $(du -sb benchmarks/2026-12-04-gpu | cut -f1) ))
for d in $G/a $G/b $G/c; do
    size=$(( tree + $(du -sb $d | cut -f1) ))
    echo "$d with the checkout: $size bytes$([ $size -gt 67108864 ] && echo " -- over 64 MiB, the call would be refused")"
done
