"""Feature store: run the target once over ShareGPT and keep what drafter training reads.

Training a drafter needs, for every training token, the target's hidden states (the drafter's
input) and the target's next-token distribution (the teacher). Computing them costs one target
forward per token (~450 tokens/s for SmolLM2-135M on 2 CPU cores), far more than a drafter's
training step, so we compute them once and train every drafter, for as many epochs as we like,
from memory-mapped numpy arrays (plain .npy: no pickle).

Layout of a store folder:
    meta.json            target name/vocab/hidden size, feature layers, token count, top-k, the target's
                         dtype when the store was built (features may be computed in bf16; a store is
                         reused across dtypes)
    tokens.npy           int32 [N]      the token ids, conversations back to back
    starts.npy           int64 [S+1]    where each conversation starts in `tokens`
    assistant.npy        uint8 [N]      1 where the *next* token belongs to an assistant reply
    features.npy         float16 [N, len(layers) * hidden]   hidden_states[layer] concatenated (bfloat16 bits
                         as uint16 where meta's feature_dtype says so: feature_dtype_for)
    topk_ids.npy         int32 [N, K]   the teacher's K most likely next tokens ...
    topk_logp.npy        float16 [N, K] ... and their log-probabilities (full-vocabulary softmax);
                                        reply positions only (elsewhere -1e4)
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from jinja2 import TemplateError
from tqdm import tqdm

from ..data.chat import chat_token_ids, check_chat_template, has_chat_template, sharegpt_messages
from ..errors import BlockdraftError


DEFAULT_MAX_LEN = 2048  # tokens of a conversation a feature store keeps: ShareGPT's median is ~1,000


def default_feature_layers(num_layers: int, n: int = 5) -> tuple[int, ...]:
    """DFlash's choice: n layers evenly spaced from layer 1 to L-3, plus the final (normed) layer L.

    hidden_states[L] is the normed output the LM head reads: what BPD heads use.
    """
    spaced = np.linspace(1, max(1, num_layers - 3), n).round().astype(int).tolist()
    return tuple(sorted(set(spaced))) + (num_layers,)


def conversation_ids(tokenizer, record: dict, max_len: int, eos_ids=()) -> tuple[list[int], list[int]] | None:
    """Chat-template token ids of one ShareGPT record, and the assistant mask (1 where the *next* token is a
    reply token). Replies are found from the target's own template (data/chat.py), whatever its format."""
    messages = sharegpt_messages(record)
    if messages is None:
        return None
    if not has_chat_template(tokenizer):
        return _plain_conversation_ids(tokenizer, messages, max_len)
    try:
        ids, reply = chat_token_ids(tokenizer, messages, eos_ids)
    except TemplateError:  # a template that refuses this conversation (e.g. a role order it forbids)
        return None
    ids = ids[:max_len]
    mask = reply[1 : len(ids)] + [0]  # position i is trained when token i+1 is a reply token
    return (ids, mask) if any(mask) else None


def _plain_conversation_ids(tokenizer, messages, max_len):
    """Tokenizers without a chat template (tiny test models): messages back to back, replies masked."""
    ids, mask = [], []
    for m in messages:
        part = tokenizer(m["content"] + "\n", add_special_tokens=False)["input_ids"]
        ids += part
        mask += [int(m["role"] == "assistant")] * len(part)
    mask = mask[1:] + [0]  # position i is trained when token i+1 is a reply token
    return (ids[:max_len], mask[:max_len]) if any(mask[:max_len]) else None


@dataclass
class FeatureStore:
    """Read-only view of a store folder (memory-mapped)."""

    path: Path
    meta: dict
    tokens: np.ndarray
    starts: np.ndarray
    assistant: np.ndarray
    features: np.ndarray
    topk_ids: np.ndarray
    topk_logp: np.ndarray

    @classmethod
    def open(cls, path) -> "FeatureStore":
        path = Path(path)
        if not (path / "meta.json").is_file():
            raise BlockdraftError(f"'{path}' is not a feature store (no meta.json)")
        meta = json.loads((path / "meta.json").read_text())
        n, s = meta["n_tokens"], meta["n_seqs"]

        def load(name):
            return np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False)

        return cls(path, meta, load("tokens")[:n], load("starts")[: s + 1], load("assistant")[:n],
                   load("features")[:n], load("topk_ids")[:n], load("topk_logp")[:n])

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.meta["layers"])

    def layer_slice(self, layers: tuple[int, ...]) -> np.ndarray:
        """Column indices of `features` that hold the given layers, in order."""
        h = self.meta["hidden_size"]
        missing = [lay for lay in layers if lay not in self.layers]
        if missing:
            raise BlockdraftError(f"feature store {self.path} lacks target layers {missing} (has {self.layers})")
        return np.concatenate([np.arange(h) + h * self.layers.index(lay) for lay in layers])

    def read(self, rows, cols: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
        """float32 features at `rows` (a slice or an index array) and columns `cols`, on `device`.

        Copied as float16 and widened by torch on the device: numpy's float16 -> float32 conversion is
        several times slower than torch's and made up the block drafter's training step on a GPU, and a GPU
        takes half the bytes (BENCHMARKS.md, "Decisions": feature stores)."""
        x = self.features[rows]
        if len(cols) != x.shape[1] or not np.array_equal(cols, np.arange(len(cols))):
            x = x[:, cols]
        x = torch.from_numpy(np.require(x, requirements="CW"))  # a memmap view is read-only
        return (x.view(torch.bfloat16) if self.bf16 else x).to(device).float()

    @property
    def bf16(self) -> bool:
        """Features kept as bfloat16 bits (uint16 on disk): see FEATURE_DTYPE."""
        return self.meta.get("feature_dtype") == "bfloat16"

    def feature_sample(self, cols: np.ndarray, rows: int = 50_000) -> np.ndarray:
        """float32 features of about `rows` evenly spaced tokens (for normalisation statistics)."""
        return self.read(slice(None, None, max(1, len(self.tokens) // rows)), cols).numpy()

    def sequences(self):
        for a, b in zip(self.starts[:-1], self.starts[1:], strict=True):
            yield int(a), int(b)


# Features are stored in 16 bits: float16 (more mantissa) unless the target computes them in bfloat16 anyway, or
# its residual stream outgrows float16 (Gemma's: hidden states in the hundreds of thousands, measured on
# gemma3-270m, where float16 gave inf and the block drafter's loss NaN). bfloat16 is kept as its raw bits (uint16):
# numpy has no bfloat16.
BF16_FAMILIES = ("gemma", "gemma2", "gemma3_text")


def feature_dtype_for(target) -> str:
    if target.dtype == torch.bfloat16 or target.config.model_type in BF16_FAMILIES:
        return "bfloat16"
    return "float16"


@torch.inference_mode()
def build_store(target, records, out_dir, max_tokens: int, max_len: int = DEFAULT_MAX_LEN, top_k: int = 32,
                layers: tuple[int, ...] | None = None, seed: int = 0, max_minutes: float = 0.0,
                source_sizes: list[int] | None = None) -> FeatureStore:
    """Run `target` over conversations until `max_tokens` tokens are stored. Resumable: meta.json is
    rewritten every few conversations and a rerun continues after the last stored one. With `max_minutes`,
    the store ends (complete, with fewer tokens) at the first conversation that finishes past that time:
    a time-boxed machine (a lent GPU) then always gets to training. `records` may be several sources one after
    another (`source_sizes` records each): every conversation of a source is stored before the next source's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layers = tuple(layers or default_feature_layers(target.num_layers))
    h = target.hidden_size
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    if meta is not None and (meta["target"], tuple(meta["layers"])) != (target.name, layers):
        raise BlockdraftError(f"{out} holds features of another target or layers; choose another --store folder")
    if meta is not None and meta.get("complete") and meta["capacity"] >= max_tokens:
        print(f"reusing the feature store {out} ({meta['n_tokens']:,} tokens)")
        return FeatureStore.open(out)  # built to the end before: no target pass, no tokenizing
    check_chat_template(target.tokenizer, f"target '{target.name}'")
    capacity = max(max_tokens, meta["capacity"] if meta else 0)
    if meta is not None and meta["capacity"] < max_tokens:
        raise BlockdraftError(f"{out} was created for {meta['capacity']} tokens; use a new folder for more")

    def array(name, dtype, shape):
        p = out / f"{name}.npy"
        if p.is_file():
            return np.load(p, mmap_mode="r+", allow_pickle=False)
        return np.lib.format.open_memmap(p, mode="w+", dtype=dtype, shape=shape)

    tokens = array("tokens", np.int32, (capacity,))
    assistant = array("assistant", np.uint8, (capacity,))
    feature_dtype = meta.get("feature_dtype", "float16") if meta else feature_dtype_for(target)
    feats = array("features", np.uint16 if feature_dtype == "bfloat16" else np.float16, (capacity, len(layers) * h))
    topk_ids = array("topk_ids", np.int32, (capacity, top_k))
    topk_logp = array("topk_logp", np.float16, (capacity, top_k))
    starts = array("starts", np.int64, (len(records) + 1,))
    meta = meta or {"target": target.name, "vocab_size": target.vocab_size, "hidden_size": h, "layers": list(layers),
                    "top_k": top_k, "max_len": max_len, "capacity": capacity, "n_tokens": 0, "n_seqs": 0,
                    "next_record": 0, "seed": seed, "dtype": str(target.dtype).removeprefix("torch."),
                    "feature_dtype": feature_dtype}
    order = source_order(source_sizes or [len(records)], seed)
    n, s = meta["n_tokens"], meta["n_seqs"]
    bar = tqdm(total=max_tokens, initial=n, unit="tok", desc="target features", smoothing=0.05)
    t_save = t_start = time.time()
    for k in range(meta["next_record"], len(order)):
        conv = conversation_ids(target.tokenizer, records[order[k]], max_len, target.eos_token_ids)
        if conv is None:
            continue
        ids, mask = conv
        if max_tokens - n < 16:  # full (a short conversation is no reason to stop: it used to end the store)
            break
        m = min(len(ids), max_tokens - n)
        ids, mask = ids[:m], mask[:m]
        # in the target's dtype, on its device; stored as float16 numpy arrays
        x = torch.tensor([ids], device=target.device)
        hs = target.model.base_model(input_ids=x, output_hidden_states=True, use_cache=False).hidden_states
        stacked = torch.cat([hs[i][0] for i in layers], dim=-1)
        if feature_dtype == "bfloat16":
            feats[n : n + m] = stacked.to(torch.bfloat16).view(torch.uint16).cpu().numpy()
        else:
            if not bool(torch.isfinite(stacked.to(torch.float16)).all()):
                raise BlockdraftError(f"target '{target.name}' has hidden states beyond float16's range: this store "
                                      f"({out}) was begun in float16; build a new one (it will use bfloat16)")
            feats[n : n + m] = stacked.to(torch.float16).cpu().numpy()
        # The teacher is only needed where drafts are trained (reply positions): the LM head over the
        # full vocabulary is a third of the forward's cost, so skip it elsewhere.
        rows = torch.tensor(mask, dtype=torch.bool)
        top_ids, top_logp = teacher_topk(target.model.get_output_embeddings(), hs[-1][0][rows.to(target.device)],
                                         top_k)
        ids_k = torch.zeros(m, top_k, dtype=torch.int32)
        logp_k = torch.full((m, top_k), -1e4, dtype=torch.float16)
        ids_k[rows], logp_k[rows] = top_ids.int().cpu(), top_logp.to(torch.float16).cpu()
        topk_ids[n : n + m] = ids_k.numpy()
        topk_logp[n : n + m] = logp_k.numpy()
        tokens[n : n + m] = ids
        assistant[n : n + m] = mask
        starts[s] = n
        n, s = n + m, s + 1
        starts[s] = n
        bar.update(m)
        meta.update(n_tokens=n, n_seqs=s, next_record=k + 1)
        if time.time() - t_save > 30 or n >= max_tokens:
            _flush(meta_path, meta, (tokens, assistant, feats, topk_ids, topk_logp, starts))
            t_save = time.time()
        if n >= max_tokens or (max_minutes and time.time() - t_start > 60 * max_minutes):
            break
    bar.close()
    meta["complete"] = True  # the loop ran to its end (not killed): a later run reuses the store as it is
    _flush(meta_path, meta, (tokens, assistant, feats, topk_ids, topk_logp, starts))
    return FeatureStore.open(out)


def source_order(sizes: list[int], seed: int) -> list[int]:
    """The order a store reads records in: each source's shuffled, the sources one after another, so that
    `--data selfdistill.jsonl,sharegpt` keeps every self-distilled reply and fills the rest of the store with
    ShareGPT (one source: the plain shuffle stores were always built in, so they still resume)."""
    rng, order, start = random.Random(seed), [], 0
    for n in sizes:
        part = list(range(start, start + n))
        rng.shuffle(part)
        order.extend(part)
        start += n
    return order


def teacher_topk(head: torch.nn.Module, states: torch.Tensor, k: int, chunk: int = 64):
    """The teacher's k most likely next tokens at each state and their log-probabilities (full-vocabulary
    softmax): (ids [n, k], logp [n, k] float32).

    Row chunks keep each [chunk, V] block of logits in cache, and the top-k is taken on the logits in the
    target's dtype (then normalised by a float32 logsumexp): 40% less time than a float32 log_softmax over
    [n, V] followed by topk, with the same values."""
    ids, logp = [], []
    for part in states.split(chunk):
        logits = head(part)
        values, top = logits.topk(k, dim=-1)
        ids.append(top)
        logp.append(values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True))
    return torch.cat(ids), torch.cat(logp)  # no rows: one empty chunk, so still [0, k]


def _flush(meta_path: Path, meta: dict, arrays) -> None:
    for a in arrays:
        a.flush()
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(meta_path)
