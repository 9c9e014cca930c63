#!/usr/bin/env bash
# Build what run.sh needs on the GPU machine, in two folders the device tool carries (64 MiB a call, with the
# checkout): .gpu/a = the GGUF's first 65 MB; .gpu/b = the rest of it, its sha256, the gguf wheel, a ShareGPT
# subset (subset.py) and the shipped dflash and treeflash checkpoints to fine-tune from.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
G=.gpu
rm -rf $G && mkdir -p $G/a $G/b/wheels $G/b/init
gguf=$(python -c "from blockdraft.target.loading import resolve_target; print(resolve_target().path)")
split -b 65000000 -a 2 "$gguf" $G/gguf.part.
mv $G/gguf.part.aa $G/a/ && mv $G/gguf.part.ab $G/b/
sha256sum "$gguf" | cut -d' ' -f1 > $G/b/gguf.sha256
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d $G/b/wheels 'gguf>=0.10'
python benchmarks/2026-12-04-gpu/subset.py $G/b/sharegpt.json.xz --records "${RECORDS:-4400}"
for k in dflash treeflash; do cp -r src/blockdraft/checkpoints/smollm2-135m/$k $G/b/init/; done
du -sb $G/a $G/b
