"""Teacher-forced metrics of the shipped and the GPU-trained drafters on one held-out store (30k tokens of
held-out ShareGPT): python teacher_forced.py STORE (the store run.sh builds, e.g. built here with DEVICE=cpu)."""
import sys
from blockdraft import Target
from blockdraft.drafters import BlockDrafter, HeadsDrafter
from blockdraft.drafters.treeflash import TreeFlashDrafter
from blockdraft.train.features import FeatureStore
from blockdraft.train.block import evaluate_block
from blockdraft.train.heads import evaluate_heads
from blockdraft.train.treeflash import evaluate_treeflash
from blockdraft.train.common import for_training
target = Target.load("smollm2-135m", "float32", "cpu")
store = FeatureStore.open(sys.argv[1])
CK = "src/blockdraft/checkpoints/smollm2-135m"
for name, ck in [("shipped", CK), ("gpu", "runs/gpu")]:
    bpd = for_training(HeadsDrafter.from_pretrained(f"{ck}/bpd", target))
    print(name, "bpd", evaluate_heads(bpd, store).summary().replace("\n", " | "))
    dfl = for_training(BlockDrafter.from_pretrained(f"{ck}/dflash", target))
    cols = store.layer_slice(tuple(dfl.config.feature_layers))
    print(name, "dflash", evaluate_block(dfl, store, cols).summary().replace("\n", " | "))
    for mod, base in [("hydra", bpd), ("treeflash", dfl)]:  # each module on the base loaded above
        d = TreeFlashDrafter.from_pretrained(f"{ck}/{mod}", target, base)
        print(name, mod, evaluate_treeflash(d, store).summary().replace("\n", " | "))
