"""Request validation for the OpenAI-compatible endpoints: JSON body -> GenerationRequest, or an APIError."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..errors import BlockdraftError
from ..methods import check_method as registered
from ..methods import parse_method
from ..verify import SamplingParams

DEFAULT_MAX_TOKENS = 128  # as `blockdraft generate --max-new-tokens`; always capped by the context
# A tiny positive temperature divides float32 logits into infinities and the softmax into NaN (1e-300 does;
# verify/sampling.py then fails the request at its first step). vLLM clamps anything below 0.01 to 0.01: refused
# here instead, naming the bound, since 0 asks for greedy decoding.
MIN_TEMPERATURE = 0.01
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # a stream holds back up to the longest stop string's length
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


class APIError(Exception):
    """An error answered as OpenAI does: HTTP status + {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class GenerationRequest:
    """One validated generation: what the scheduler needs, nothing HTTP-specific."""

    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    method: str
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    chat: bool = False
    extra: dict = field(default_factory=dict)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _number(body: dict, name: str, default, low: float, high: float, low_open: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python: `"temperature": true` is a client bug, not 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise APIError(400, f"'{name}' must be a number, got {json.dumps(value)}", param=name)
    if value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise APIError(400, f"'{name}' must be in {bound}, got {value}", param=name)
    return value


def _integer(body: dict, name: str, default=None, low: int | None = None, high: int | None = None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"'{name}' must be an integer, got {json.dumps(value)}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bound = (f"at least {low}" if high is None else f"at most {high}" if low is None
                 else f"an integer from {low} to {high}")
        raise APIError(400, f"'{name}' must be {bound}, got {value}", param=name)
    return value


def _temperature(body: dict) -> float:
    t = float(_number(body, "temperature", 0.0, 0.0, 2.0))  # OpenAI's range; 0 = greedy
    if 0 < t < MIN_TEMPERATURE:
        raise APIError(400, f"'temperature' must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {t}: tiny ones "
                            "overflow the target's logits into infinities", param="temperature")
    return t


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or not all(isinstance(s, str) for s in stop):
        raise APIError(400, f"'stop' must be a string or a list of at most {MAX_STOPS} strings", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        longest = max(len(s) for s in stop)
        raise APIError(400, f"each 'stop' string may have at most {MAX_STOP_CHARS} characters, got {longest}",
                       param="stop")
    return tuple(s for s in stop if s)


def served_methods(methods) -> tuple[str, ...]:
    """The method specs a server loads, from `--method a,b,...` (or a list): each registered, none twice, the
    first the default. Raises BlockdraftError naming what is wrong. Commas separate specs, so hybrid's sources
    are joined by '+' here, as in bench's --methods."""
    specs = methods.split(",") if isinstance(methods, str) else list(methods)
    specs = [s.strip() for s in specs if isinstance(s, str) and s.strip()]
    if not specs:
        raise BlockdraftError(f"no method to serve in {methods!r}: give --method NAME[,NAME...]")
    for spec in specs:
        registered(spec)  # the registry's own check: a malformed spec or an unknown name, in one line
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise BlockdraftError(f"method {twice[0]!r} is given twice in --method")
    return tuple(specs)


def pick_method(spec, served: tuple[str, ...]) -> str:
    """The per-request `method` field (a blockdraft extension) resolved among the served specs: the exact spec,
    or its name alone when one served spec has that name; none given: the first served (the default)."""
    if spec is None:
        return served[0]
    if not isinstance(spec, str) or not spec.strip():
        raise APIError(400, "'method' must be a method name such as 'lookup'", param="method")
    spec = spec.strip()
    if spec in served:
        return spec
    named = [s for s in served if parse_method(s)[0] == spec]
    if len(named) == 1:
        return named[0]
    why = f"'{spec}' names several of them" if named else f"method '{spec}' is not served here"
    raise APIError(400, f"{why}: choose one of {', '.join(served)} (the methods and their options are the "
                        "server's choice: blockdraft serve --method A,B,...)", param="method", code="invalid_method")


def _prompt_ids(target, body: dict) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, str):
        try:
            ids = target.encode(prompt, chat_template=False)  # completions take the text raw, as OpenAI's do
        except BlockdraftError as e:
            raise APIError(400, str(e), param="prompt") from None
    elif isinstance(prompt, list):
        raise APIError(400, "'prompt' must be one string or one list of token ids (batches of prompts: send "
                            "one request each)", param="prompt")
    else:
        raise APIError(400, "'prompt' is required: a string or a list of token ids", param="prompt")
    return ids


def _chat_ids(target, body: dict) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' is required: a non-empty list of {role, content}", param="messages")
    conversation = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             and isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)  # OpenAI's content parts, text only
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(
                content, str):
            raise APIError(400, f"messages[{i}] must be {{\"role\": system|user|assistant, \"content\": string "
                                "or text parts}", param=f"messages[{i}]")
        conversation.append({"role": m["role"], "content": content})
    if target.tokenizer is None or not getattr(target.tokenizer, "chat_template", None):
        raise APIError(400, f"the target '{target.name}' has no chat template: use /v1/completions",
                       param="messages")
    try:
        return target.encode_chat(conversation)
    except Exception as e:  # a template that rejects the conversation (e.g. roles out of order)
        raise APIError(400, f"the chat template rejected the messages: {e}", param="messages") from None


# Fields that would change what comes back, which this server does not do: refused rather than ignored.
UNSUPPORTED = {"echo": (False,), "logprobs": (None, False), "top_logprobs": (None, 0), "best_of": (None, 1),
               "suffix": (None, ""), "logit_bias": (None, {}), "frequency_penalty": (None, 0, 0.0),
               "presence_penalty": (None, 0, 0.0), "tools": (None, []), "functions": (None, []),
               "response_format": (None, {"type": "text"})}


def _refuse_unsupported(body: dict) -> None:
    for name, harmless in UNSUPPORTED.items():
        if name in body and not any(body[name] == h and type(body[name]) is type(h) for h in harmless):
            raise APIError(400, f"'{name}' is not supported by this server (blockdraft returns the target's own "
                                "tokens and distribution, and nothing else)", param=name, code="unsupported")


def parse_generation(target, body: dict, methods: tuple[str, ...], model_name: str, chat: bool) -> GenerationRequest:
    """Validate a /v1/completions (chat=False) or /v1/chat/completions body against the target and the served
    `methods` (the first is the default)."""
    model = body.get("model")
    if model is not None and model != model_name:
        raise APIError(404, f"the model '{model}' does not exist: this server serves '{model_name}'",
                       param="model", code="model_not_found")
    n = _integer(body, "n", 1)
    if n != 1:
        raise APIError(400, f"only n=1 is supported, got n={n}", param="n")
    _refuse_unsupported(body)
    temperature = _temperature(body)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(body, "top_k", 0, low=0)  # an extension (as vLLM's); 0 = off
    seed = _integer(body, "seed", None, *SEED_RANGE)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    method = pick_method(body.get("method"), methods)
    ids = _chat_ids(target, body) if chat else _prompt_ids(target, body)
    try:
        target.check_prompt(ids)
    except BlockdraftError as e:
        raise APIError(400, str(e), param="messages" if chat else "prompt", code="context_length_exceeded"
                       if len(ids) >= target.max_length else None) from None
    room = target.max_length - len(ids)
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, None, low=1)
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, room)
    elif max_tokens > room:
        raise APIError(400, f"the prompt has {len(ids)} tokens and {key}={max_tokens}, but the context holds "
                            f"{target.max_length} tokens: ask for at most {room}", param=key,
                       code="context_length_exceeded")
    return GenerationRequest(ids, max_tokens, SamplingParams(float(temperature), top_k, float(top_p)), method,
                             seed, _stop(body), stream, include_usage, chat)
