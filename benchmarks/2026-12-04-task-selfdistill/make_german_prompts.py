"""German-to-English translation prompts from WMT17's German news sentences, the German that ShareGPT has run out of.

Spec-Bench's translation questions are WMT news sentences, Moses-tokenized ("Singapur , da ..."), asked as
"Translate German to English: <sentence>". Rounds 1-4 found German only in ShareGPT (nearly all of it used by rounds
1 and 2), and round 4's French/Spanish/Portuguese/Italian prompts did not carry over to German. sacrebleu's source
distribution (PyPI, not its wheel) ships WMT17's en-de system outputs for its tests, with newstest2017's human German
reference: 3,004 news sentences, a different year from Spec-Bench's (checked below: no sentence in common). They are
tokenized with sacremoses (the Moses tokenizer WMT used) so the prompts have Spec-Bench's shape.
The reference is in document order: its last HELDOUT_BLOCK sentences are held out (30 of them become the held-out
German set), the rest give one prompt per sentence and one per two neighbouring sentences.
Usage: python make_german_prompts.py TRAIN_OUT.jsonl HELDOUT_OUT.jsonl [HELDOUT_COUNT]   (needs sacremoses)
"""

import bz2
import io
import itertools
import json
import pickle
import random
import subprocess
import sys
import tarfile
from pathlib import Path

from sacremoses import MosesTokenizer

from blockdraft.bench.questions import load_questions

SOURCE = Path("runs/german-src")
SACREBLEU = "sacrebleu==2.6.0"
MEMBER = "test/wmt17_en_de_systems.pkl.bz2"
HELDOUT_BLOCK = 100
PREFIX = "Translate German to English: "


class ListsOfStrings(pickle.Unpickler):
    """The test pickle holds (name, [[sentence, ...]]) pairs; refuse any other class, as pickles can run code."""

    def find_class(self, module, name):
        if module == "builtins" and name in ("list", "tuple", "str"):
            return getattr(__import__("builtins"), name)
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in {MEMBER}")


def wmt17_german() -> list[str]:
    """newstest2017's German reference, downloaded once as sacrebleu's source distribution."""
    if not list(SOURCE.glob("sacrebleu-*.tar.gz")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d",
                        str(SOURCE), SACREBLEU], check=True)
    with tarfile.open(next(SOURCE.glob("sacrebleu-*.tar.gz"))) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(MEMBER))
        systems = dict(ListsOfStrings(io.BytesIO(bz2.decompress(tar.extractfile(member).read()))).load())
    return [s.strip().lstrip("\ufeff") for s in systems["reference"][0]]


def main(train_out: str, heldout_out: str, heldout_count: int = 30) -> None:
    moses = MosesTokenizer(lang="de")
    sentences = [moses.tokenize(s, return_str=True, escape=False) for s in wmt17_german()]
    spec_bench = {turn.removeprefix(PREFIX) for q in load_questions("spec-bench") for turn in q.turns}
    overlap = sum(s in spec_bench for s in sentences)
    if overlap:  # Spec-Bench is for evaluation only
        raise SystemExit(f"{overlap} WMT17 sentences are Spec-Bench questions: refusing to train on them")
    train, heldout = sentences[:-HELDOUT_BLOCK], sentences[-HELDOUT_BLOCK:]
    rng = random.Random(0)
    prompts = [PREFIX + s for s in train] + [f"{PREFIX}{a} {b}" for a, b in itertools.pairwise(train)]
    rng.shuffle(prompts)
    with open(train_out, "w") as f:
        for n, prompt in enumerate(prompts):
            f.write(json.dumps({"id": f"german{n}", "conversations": [{"from": "human", "value": prompt}]}) + "\n")
    with open(heldout_out, "w") as f:
        for n, s in enumerate(rng.sample(heldout, heldout_count)):
            f.write(json.dumps({"question_id": f"german{n}", "category": "translation", "turns": [PREFIX + s]}) + "\n")
    print(f"{len(sentences)} WMT17 sentences: {len(prompts)} training prompts, {heldout_count} held out "
          f"(of the last {HELDOUT_BLOCK})", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
