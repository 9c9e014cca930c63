#!/bin/bash
# Replies of the target to Spec-Bench-shaped prompts built from ShareGPT's training split (make_prompts.py:
# translation, summarization, RAG, QA), mixed half and half (by characters) with the last round's self-distilled
# ShareGPT replies (runs/sd5/sd.jsonl, a replay that keeps what the drafters learned), then fine-tunes of the
# shipped drafters on the mix, compared on the quick subset and on held-out ShareGPT.
# train2/heldout2: a longer fine-tune of the pair shipped on 2026-12-05 (dflash's run resumed for 10 more minutes on
# the same store, then treeflash's module fine-tuned from the shipped one on it), compared with that pair.
# r2-*: a second round from the shipped (round-1) pair: replies to the next prompts of the same list, mixed with the
# replay the same way, and fine-tunes of the shipped dflash and treeflash on them, compared on both held-out sets.
# They ran at 1680194: from f5210f1 on, $CK holds round 2's pair, so check out 1680194's checkpoints to redo them.
# r3-*: a third round for translation alone, from round 2's pair: make_translation_prompts.py's French, Spanish,
# Portuguese and Italian prompts (ShareGPT's German is spent), replies mixed half and half with ShareGPT's training
# split itself (round 1's self-distilled replay was not kept), fine-tunes of dflash and treeflash, and the three
# held-out sets (ShareGPT, task shapes, translation from the held-out split's Spanish and Portuguese).
# r4-*: round 3 again with the target's own chat replies as the replay: 25 minutes of self-distilled ShareGPT
# (two turns, written to runs/sd5/sd.jsonl, the file mix.py replays by default), the translation replies regenerated
# the same way, and the same fine-tunes and held-out sets. They ran at f2b7bd8: from 48dcf3b on, $CK holds round 4's
# pair, so check out f2b7bd8's checkpoints to redo them.
# r5-hydra-*: round 4's store and mix for hydra, whose heads and module were last fine-tuned in round 1: bpd's heads
# from the shipped ones, hydra's module on them, and the three held-out sets against the shipped bpd and hydra.
# r6-*: German at last, for Spec-Bench's translation questions: make_german_prompts.py's prompts from WMT17's German
# news sentences (sacrebleu's source distribution), replies mixed half and half with a replay of round 4's mix (its
# translation replies and the self-distilled chat), fine-tunes of the shipped (round 4) pair, and four held-out sets:
# WMT17's last German sentences first, then round 4's three.
# r6b-*: round 6's German replies mixed half and half with the self-distilled chat alone (mix.py's default replay), as
# round 4 did: round 6's replay was half round 4's translation replies, so chat was a quarter of its mix, and
# held-out ShareGPT lost a little.
# r7-*: both languages' replies together (round 6's German and round 4's Spanish, Portuguese, French and Italian) as the
# task half, the self-distilled chat as the other half: chat keeps round 4's half share, and German joins the
# translation replies instead of displacing them. Its store is about twice round 6b's, so the budgets are longer.
# Rounds 5 to 7 fine-tuned round 4's pair at b358d25: from de6ff3f on, $CK holds round 7's pair, so check out
# b358d25's checkpoints to redo them.
# r8-hydra-*: bpd's heads and hydra's module on round 7's store, one epoch each (its store is twice round 4's), then
# held-out German and ShareGPT 60 against the shipped ones.
# r8-*: coding and science, which every translation round gave back: make_code_prompts.py's prompts from ShareGPT's
# training split (conversations the chat replay has not used), their replies added to round 7's task half (so the
# task half is translation and code, the other half the whole chat replay), fine-tunes of the shipped (round 7)
# pair, and three held-out sets: held-out coding/science first, then German and ShareGPT 60 (round 7's Spanish/
# Portuguese and task-shape sets were left out for time: this round keeps all of round 7's translation replies).
# r9-*: round 8's store again, no new replies: bpd's heads and hydra's module fine-tuned on it one epoch each (its mix
# is two thirds chat-shaped, round 7's was half translation), and the shipped (round 8) dflash given one more epoch at
# a third of the learning rate, with treeflash's module fine-tuned on it the same way; held-out ShareGPT 60 for all,
# German and coding/science for bpd and hydra, and hybrid (suffix + hydra) with either. They ran at d6b4468: from
# 5d14211 on, $CK holds the new bpd and hydra, so check out d6b4468's checkpoints to redo the hydra steps.
# r10-*: new chat, as round 9 found that more epochs over round 8's store overfit: 28 more minutes of self-distilled
# ShareGPT (two turns, conversations neither the chat replay nor round 8's coding replies used), mixed half and half
# by characters with a replay of round 8's whole mix (so the new chat is the half the drafters have not seen), one
# epoch of each fine-tune from the shipped checkpoints, then held-out ShareGPT 60 and the quick subset for all four.
# r10-heldout ran at ec2c652 (before the ship). r10-quick's shipped rows loaded round 10's checkpoints (copied into $CK
# as it started), so it measured them twice; the old ones are paired from earlier runs with paired.py's METHOD@RUN.
# Usage: bash run.sh sd | mix | train | quick | heldout | hydra-module | heldout-tasks | train2 | heldout2
#                    | r2-sd | r2-train | r2-heldout | r3-sd | r3-train | r3-heldout | r4-sd | r4-train | r4-heldout
#                    | r5-hydra-train | r5-hydra-heldout | r6-sd | r6-train | r6-heldout
#                    | r6b-mix | r6b-train | r6b-heldout | r7-mix | r7-train | r7-heldout
#                    | r8-hydra-train | r8-hydra-heldout | r8-sd | r8-train | r8-heldout
#                    | r9-hydra-train | r9-train | r9-heldout | r9-hydra-heldout | r9-hybrid
#                    | r10-sd | r10-train | r10-heldout | r10-quick
set -e
D=benchmarks/2026-12-04-task-selfdistill
CK=src/blockdraft/checkpoints/smollm2-135m
W=runs/task
# the steps' shared commands: replies to a prompt file (later options override), a fine-tune on a mix (its store
# built by the first one), the methods comparing a round's pair with the shipped one, and both held-out benches of
# METHODS (ShareGPT's first 60 held-out prompts, the 30 task-shaped ones)
distill() { local out=$1 prompts=$2; shift 2
            blockdraft selfdistill "$out" --data "$prompts" --batch 8 --turns 1 --max-prompt-tokens 1100 \
              --max-tokens 3000000 --max-minutes 35 --threads 2 "$@"; }
finetune() { local mix=$1 store=$2; shift 2
             blockdraft train --data $mix --store $store --max-tokens 1200000 --lr 3e-4 --epochs 2 --threads 2 "$@"; }
# a round's base drafter (KIND, checkpoint name BASE) fine-tuned from the shipped one on ROUND's mix, then its tree
# module (checkpoint name MODULE) fine-tuned from the shipped one on that base; further options go to both
finetune_base_and_module() { local round=$1 kind=$2 base=$3 module=$4 base_minutes=$5 module_minutes=$6; shift 6
  finetune runs/$round/mix.jsonl runs/store-$round --drafter $kind --init $CK/$base --max-minutes $base_minutes \
    --out runs/$round/$base "$@"
  finetune runs/$round/mix.jsonl runs/store-$round --drafter treeflash --init runs/$round/$base \
    --init-module $CK/$module --max-minutes $module_minutes --out runs/$round/$module "$@"; }
# dflash and treeflash's module; bpd's heads and hydra's module (ROUND BASE_MINUTES MODULE_MINUTES [OPTIONS])
finetune_pair() { finetune_base_and_module $1 block dflash treeflash "${@:2}"; }
finetune_hydra() { finetune_base_and_module $1 heads bpd hydra "${@:2}"; }
pair_methods() { local dir=runs/$1
  echo ar,dflash,dflash:checkpoint=$dir/dflash,treeflash:budget=32,treeflash:budget=32:checkpoint=$dir/dflash:module=$dir/treeflash; }
hydra_methods() { local dir=runs/$1
  echo ar,bpd,bpd:checkpoint=$dir/bpd,hydra,hydra:checkpoint=$dir/bpd:module=$dir/hydra; }
# one held-out bench: QUESTIONS METHODS OUT [more bench options]
heldout_bench() { blockdraft bench --questions $1 --max-new-tokens 128 --threads 2 --no-compile --methods $2 --out $3 \
                   "${@:4}"; }
both_heldout() { local methods=$1 prefix=$2
  heldout_bench sharegpt $methods ${prefix}heldout60 --per-category 60
  heldout_bench $D/heldout_tasks.jsonl $methods ${prefix}heldout-tasks; }
# a translation round's three held-out benches of METHODS: translation first (what the round is for), then both above
translation_heldout() { local methods=$1 prefix=$2
  heldout_bench $D/heldout_translation.jsonl $methods ${prefix}heldout-translation
  both_heldout $methods $prefix; }
# a German round's four held-out benches of METHODS: WMT17's held-out German first, then the three above
german_heldout() { local methods=$1 prefix=$2
  heldout_bench $D/heldout_german.jsonl $methods ${prefix}heldout-german
  translation_heldout $methods $prefix; }
case $1 in
sd)
  mkdir -p $W
  python $D/make_prompts.py $W/prompts.jsonl
  distill $W/sd.jsonl $W/prompts.jsonl
  ;;
mix)
  python $D/mix.py $W/mix.jsonl $W/sd.jsonl
  ;;
train)
  # the first command builds the feature stores runs/store-task(-valid) from the mix
  run() { finetune $W/mix.jsonl runs/store-task "$@"; }
  run --drafter block --init $CK/dflash --max-minutes 10 --out $W/dflash
  run --drafter treeflash --init $W/dflash --init-module $CK/treeflash --max-minutes 10 --out $W/treeflash
  run --drafter heads --init $CK/bpd --max-minutes 6 --out $W/bpd
  run --drafter treeflash --init $W/bpd --init-module $CK/hydra --max-minutes 7 --out $W/hydra
  ;;
hydra-module)
  # hydra's module alone fine-tuned on the same store, on the shipped bpd heads, then both benches for it
  finetune $W/mix.jsonl runs/store-task --drafter treeflash --init $CK/bpd --init-module $CK/hydra --max-minutes 7 \
    --out $W/hydra-module
  blockdraft bench --questions sharegpt --per-category 20 --max-new-tokens 128 --threads 2 --no-compile \
    --methods ar,hydra,hydra:module=$W/hydra-module --out $D/hydra-module-heldout
  blockdraft bench --per-category 2 --max-new-tokens 128 --threads 2 --no-compile \
    --methods ar,hydra,hydra:module=$W/hydra-module --out $D/hydra-module-quick
  ;;
quick)
  blockdraft bench --per-category 2 --max-new-tokens 128 --threads 2 \
    --methods ar,hf,dflash,dflash:checkpoint=$W/dflash,treeflash:budget=32,treeflash:budget=32:checkpoint=$W/dflash:module=$W/treeflash,bpd,bpd:checkpoint=$W/bpd,hydra,hydra:checkpoint=$W/bpd:module=$W/hydra \
    --out $D/quick
  ;;
heldout)
  blockdraft bench --questions sharegpt --per-category 20 --max-new-tokens 128 --threads 2 --no-compile \
    --methods ar,dflash,dflash:checkpoint=$W/dflash,treeflash:budget=32,treeflash:budget=32:checkpoint=$W/dflash:module=$W/treeflash,bpd,bpd:checkpoint=$W/bpd,hydra,hydra:checkpoint=$W/bpd:module=$W/hydra \
    --out $D/heldout
  ;;
heldout-tasks)
  # held-out prompts of three of the task shapes (make_heldout.py: ShareGPT's held-out split, 10 per category)
  (cd $D && python make_heldout.py heldout_tasks.jsonl 10)  # it imports make_prompts.py from its folder
  blockdraft bench --questions $D/heldout_tasks.jsonl --max-new-tokens 128 --threads 2 --no-compile \
    --methods ar,dflash,dflash:checkpoint=$W/dflash,treeflash:budget=32,treeflash:budget=32:checkpoint=$W/dflash:module=$W/treeflash,bpd,bpd:checkpoint=$W/bpd,hydra,hydra:checkpoint=$W/bpd:module=$W/hydra \
    --out $D/heldout-tasks
  ;;
train2)
  mkdir -p runs/task2
  cp -r $W/dflash runs/task2/dflash   # the shipped dflash's run, with its resume state
  blockdraft train --resume runs/task2/dflash --max-minutes 20
  finetune $W/mix.jsonl runs/store-task --drafter treeflash --init runs/task2/dflash --init-module $CK/treeflash \
    --max-minutes 10 --out runs/task2/treeflash
  ;;
heldout2)
  both_heldout $(pair_methods task2) $D/run2-
  ;;
r2-sd)
  mkdir -p runs/task-r2
  cp $W/sd.jsonl runs/task-r2/sd.jsonl   # round 1's replies, so that their prompts are skipped
  distill runs/task-r2/sd.jsonl $W/prompts.jsonl
  tail -n +$(($(wc -l < $W/sd.jsonl) + 1)) runs/task-r2/sd.jsonl > runs/task-r2/new.jsonl   # this round's replies
  python $D/mix.py runs/task-r2/mix.jsonl runs/task-r2/new.jsonl
  ;;
r2-train)
  finetune_pair task-r2 12 12
  ;;
r2-heldout)
  both_heldout $(pair_methods task-r2) $D/r2-
  ;;
r3-sd)
  mkdir -p runs/task-r3
  python $D/make_translation_prompts.py runs/task-r3/prompts.jsonl $D/heldout_translation.jsonl 30
  distill runs/task-r3/sd.jsonl runs/task-r3/prompts.jsonl --max-new-tokens 256 --max-minutes 12
  python $D/mix.py runs/task-r3/mix.jsonl runs/task-r3/sd.jsonl sharegpt-train
  ;;
r3-train)
  finetune_pair task-r3 8 7
  ;;
r3-heldout)
  translation_heldout $(pair_methods task-r3) $D/r3-
  ;;
r4-sd)
  mkdir -p runs/sd5 runs/task-r4
  blockdraft selfdistill runs/sd5/sd.jsonl --data sharegpt --batch 8 --turns 2 --max-tokens 3000000 --max-minutes 25 \
    --threads 2
  python $D/make_translation_prompts.py runs/task-r4/prompts.jsonl $D/heldout_translation.jsonl 30
  distill runs/task-r4/sd.jsonl runs/task-r4/prompts.jsonl --max-new-tokens 256 --max-minutes 12
  python $D/mix.py runs/task-r4/mix.jsonl runs/task-r4/sd.jsonl
  ;;
r4-train)
  finetune_pair task-r4 8 7
  ;;
r4-heldout)
  translation_heldout $(pair_methods task-r4) $D/r4-
  ;;
r5-hydra-train)
  finetune_hydra task-r4 8 7
  ;;
r5-hydra-heldout)
  translation_heldout $(hydra_methods task-r4) $D/r5-hydra-
  ;;
r6-sd)
  mkdir -p runs/task-r6
  python -m pip install -q sacremoses   # the Moses tokenizer, for Spec-Bench's tokenized shape
  python $D/make_german_prompts.py runs/task-r6/prompts.jsonl $D/heldout_german.jsonl 30
  distill runs/task-r6/sd.jsonl runs/task-r6/prompts.jsonl --max-new-tokens 256 --max-minutes 12
  cat runs/task-r4/sd.jsonl runs/sd5/sd.jsonl > runs/task-r6/replay.jsonl
  python $D/mix.py runs/task-r6/mix.jsonl runs/task-r6/sd.jsonl runs/task-r6/replay.jsonl
  ;;
r6-train)
  finetune_pair task-r6 8 7
  ;;
r6-heldout)
  german_heldout $(pair_methods task-r6) $D/r6-
  ;;
r6b-mix)
  mkdir -p runs/task-r6b
  python $D/mix.py runs/task-r6b/mix.jsonl runs/task-r6/sd.jsonl
  ;;
r6b-train)
  finetune_pair task-r6b 8 7
  ;;
r6b-heldout)
  german_heldout $(pair_methods task-r6b) $D/r6b-
  ;;
r7-mix)
  mkdir -p runs/task-r7
  cat runs/task-r6/sd.jsonl runs/task-r4/sd.jsonl > runs/task-r7/translation.jsonl
  python $D/mix.py runs/task-r7/mix.jsonl runs/task-r7/translation.jsonl
  ;;
r7-train)
  finetune_pair task-r7 14 11
  ;;
r7-heldout)
  german_heldout $(pair_methods task-r7) $D/r7-
  ;;
r8-hydra-train)
  finetune_hydra task-r7 10 8 --epochs 1
  ;;
r8-hydra-heldout)
  heldout_bench $D/heldout_german.jsonl $(hydra_methods task-r7) $D/r8-hydra-heldout-german
  heldout_bench sharegpt ar,hydra,hydra:checkpoint=runs/task-r7/bpd:module=runs/task-r7/hydra $D/r8-hydra-heldout60 \
    --per-category 60
  ;;
r8-sd)
  mkdir -p runs/task-r8
  python $D/make_code_prompts.py runs/task-r8/prompts.jsonl $D/heldout_code.jsonl 30
  distill runs/task-r8/sd.jsonl runs/task-r8/prompts.jsonl --max-new-tokens 256 --max-minutes 18
  cat runs/task-r7/translation.jsonl runs/task-r8/sd.jsonl > runs/task-r8/task.jsonl
  python $D/mix.py runs/task-r8/mix.jsonl runs/task-r8/task.jsonl
  ;;
r8-train)
  finetune_pair task-r8 16 12
  ;;
r8-heldout)
  heldout_bench $D/heldout_code.jsonl $(pair_methods task-r8) $D/r8-heldout-code
  heldout_bench $D/heldout_german.jsonl $(pair_methods task-r8) $D/r8-heldout-german
  heldout_bench sharegpt $(pair_methods task-r8) $D/r8-heldout60 --per-category 60
  ;;
r9-hydra-train)
  finetune_hydra task-r8 10 8 --epochs 1
  ;;
r9-train)
  mkdir -p runs/task-r9
  finetune runs/task-r8/mix.jsonl runs/store-task-r8 --drafter block --init $CK/dflash --lr 1e-4 --epochs 1 \
    --max-minutes 8 --out runs/task-r9/dflash
  finetune runs/task-r8/mix.jsonl runs/store-task-r8 --drafter treeflash --init runs/task-r9/dflash \
    --init-module $CK/treeflash --lr 1e-4 --epochs 1 --max-minutes 6 --out runs/task-r9/treeflash
  ;;
r9-heldout)
  hydra=$(hydra_methods task-r8)
  heldout_bench sharegpt $(pair_methods task-r9),${hydra#ar,} $D/r9-heldout60 --per-category 60
  ;;
r9-hydra-heldout)
  heldout_bench $D/heldout_german.jsonl $(hydra_methods task-r8) $D/r9-hydra-heldout-german
  heldout_bench $D/heldout_code.jsonl $(hydra_methods task-r8) $D/r9-hydra-heldout-code
  ;;
r9-hybrid)  # hybrid (suffix + hydra) with the shipped and the new bpd/hydra: the quick subset, then held-out ShareGPT 60
  methods=ar,hf,hybrid,hybrid:checkpoint=runs/task-r8/bpd:module=runs/task-r8/hydra
  blockdraft bench --per-category 2 --max-new-tokens 128 --threads 2 --methods $methods --out benchmarks/2026-12-06-quick-r9-hybrid
  heldout_bench sharegpt ar,${methods#ar,hf,} $D/r9-hybrid-heldout60 --per-category 60
  ;;
r10-sd)
  mkdir -p runs/task-r10
  # the earlier replies head the file so that selfdistill skips their conversations; the new ones follow
  cat runs/sd5/sd.jsonl runs/task-r8/sd.jsonl > runs/task-r10/chat-all.jsonl
  old=$(wc -l < runs/task-r10/chat-all.jsonl)
  blockdraft selfdistill runs/task-r10/chat-all.jsonl --data sharegpt --batch 8 --turns 2 --max-tokens 3000000 \
    --max-minutes 28 --threads 2
  tail -n +$((old + 1)) runs/task-r10/chat-all.jsonl > runs/task-r10/chat.jsonl
  python $D/mix.py runs/task-r10/mix.jsonl runs/task-r10/chat.jsonl runs/task-r8/mix.jsonl
  ;;
r10-train)
  finetune_pair task-r10 10 8 --epochs 1
  finetune_hydra task-r10 8 9 --epochs 1
  ;;
r10-heldout)
  hydra=$(hydra_methods task-r10)
  heldout_bench sharegpt $(pair_methods task-r10),${hydra#ar,} $D/r10-heldout60 --per-category 60
  ;;
r10-quick)
  pair=$(pair_methods task-r10) hydra=$(hydra_methods task-r10)
  blockdraft bench --per-category 2 --max-new-tokens 128 --threads 2 --methods ar,hf,${pair#ar,},${hydra#ar,},\
hydra:budget=32,hydra:budget=32:checkpoint=runs/task-r10/bpd:module=runs/task-r10/hydra --out benchmarks/2026-12-06-quick-r10
  ;;
esac
