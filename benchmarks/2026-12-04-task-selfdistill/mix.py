"""Mix task-shaped replies half and half (by characters) with replayed self-distilled ShareGPT replies."""
import json
import random
import sys

from blockdraft.data.sharegpt import load_conversations, split_conversations


def chars(record):
    return sum(len(turn["value"]) for turn in record["conversations"])


def main(out, task_file, replay_file="runs/sd5/sd.jsonl"):
    # the replay keeps what the drafters learned from chat turns while they learn the task shapes; 'sharegpt-train'
    # replays ShareGPT's own training split (written replies, not the target's) where no self-distilled file is left
    task = list(load_conversations(task_file))
    if replay_file == "sharegpt-train":
        replay = list(split_conversations(load_conversations())[0])
    else:
        replay = list(load_conversations(replay_file))
    random.Random(0).shuffle(replay)
    budget, mix = sum(map(chars, task)), list(task)
    for r in replay:
        if budget <= 0:
            break
        mix.append(r)
        budget -= chars(r)
    with open(out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in mix)
    print(f"{len(task)} task conversations + {len(mix) - len(task)} replayed ones")


if __name__ == "__main__":
    main(*sys.argv[1:])
