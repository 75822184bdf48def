"""llama.cpp's models, contexts and batches: the ctypes calls that load weights, run passes and edit the KV cache.

The bindings are five modules, the only ones that call into llama.cpp (binding names drift between versions: one
place to fix): this one; :mod:`llamafleet.engine.llama_memory` (a context's KV cache: cut, copied, saved, restored),
:mod:`llamafleet.engine.llama_backend` (backend setup, llama.cpp's logs, devices, RPC),
:mod:`llamafleet.engine.llama_sampler` (sampler chains, grammars, candidate buffers) and
:mod:`llamafleet.engine.llama_lora` (LoRA adapters).

Import order matters on CUDA builds: if numpy (whose wheels bundle OpenBLAS and libgfortran) is loaded before
libggml-cuda, loading a model can crash inside llama.cpp's own log formatting (``llama_model::print_info``; seen on
an H200 machine with CUDA 13). So ``llama_cpp`` is imported here before numpy, and processes that load models call
import this module first thing (the worker does; so does the CLI for in-process engine commands).

Lifetimes are explicit: :class:`Model`, :class:`Context`, :class:`Batch` and the sampler chains free their native
memory in ``close()`` (also via ``with``), never through the garbage collector. llama.cpp's own log lines are routed
into Python ``logging`` under the logger ``llamafleet.llama_cpp`` (:mod:`llamafleet.engine.llama_log`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp as lc  # isort: skip  (before numpy, see above)
import numpy as np
import numpy.typing as npt

from llamafleet.engine import llama_log
from llamafleet.engine.llama_backend import Native, init_backend, model_devices
from llamafleet.engine.llama_memory import KvMemory
from llamafleet.engine.llama_sampler import Candidates, greedy_chain
from llamafleet.engine.types import EngineConfig

log = llama_log.log

_SPLIT = {"none": lc.LLAMA_SPLIT_MODE_NONE, "layer": lc.LLAMA_SPLIT_MODE_LAYER, "tensor": lc.LLAMA_SPLIT_MODE_TENSOR}
_KV_TYPE = {"f16": lc.GGML_TYPE_F16, "q8_0": lc.GGML_TYPE_Q8_0, "q4_0": lc.GGML_TYPE_Q4_0}
# what a saved sequence state depends on besides the model and the context's shape (llama.cpp's in-memory state
# carries no version of its own, so the bindings' version stands for it)
STATE_FORMAT = (f"llama.cpp state seq v{lc.LLAMA_STATE_SEQ_VERSION} session v{lc.LLAMA_SESSION_VERSION}, "
                f"llama-cpp-python {lc.__version__}")
_FLASH = {None: lc.LLAMA_FLASH_ATTN_TYPE_AUTO, True: lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
          False: lc.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def max_parallel_sequences() -> int:
    return int(lc.llama_max_parallel_sequences())


# ---------------------------------------------------------------------------------------------------------------
# Model: weights, vocabulary, chat template
# ---------------------------------------------------------------------------------------------------------------
class Model(Native):
    """A loaded GGUF model. ``progress(fraction)`` is called while loading."""

    def __init__(self, cfg: EngineConfig, progress: Callable[[float], None] | None = None) -> None:
        init_backend(cfg.llama_log_level)
        params = lc.llama_model_default_params()
        params.n_gpu_layers = cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else 10_000
        params.split_mode = _SPLIT[cfg.split_mode]
        params.main_gpu = cfg.main_gpu
        self._split = None
        if cfg.tensor_split:
            n = lc.llama_max_devices()
            arr = (ctypes.c_float * n)(*list(cfg.tensor_split)[:n])
            self._split = arr
            params.tensor_split = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
        if cfg.rpc_servers:  # the RPC servers' devices first (as llama.cpp orders them), then this host's GPUs or
            # CPU: the last layers and the output head stay here, so only activations cross the network, not logits
            self._devices = model_devices(cfg.rpc_servers)
            params.devices = ctypes.addressof(self._devices)
        self._progress_cb = None
        if progress is not None:
            def _cb(frac: float, _u: ctypes.c_void_p) -> bool:
                progress(float(frac))
                return True
            self._progress_cb = lc.llama_progress_callback(_cb)
            params.progress_callback = self._progress_cb
        ptr = lc.llama_model_load_from_file(cfg.model_path.encode(), params)
        if not ptr:
            raise RuntimeError(f"llama.cpp could not load the model {cfg.model_path} (see the llama_cpp log above)")
        self.ptr = ptr
        self.vocab = lc.llama_model_get_vocab(ptr)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(lc.llama_model_n_ctx_train(ptr))
        self.size_bytes = int(lc.llama_model_size(ptr))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self.vocab))
        self.pieces = self._piece_table()
        self.eog = np.array([bool(lc.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)], dtype=bool)
        self.n_embd = int(lc.llama_model_n_embd_out(ptr))  # the width of its hidden states, so of an embedding
        arch = self.meta("general.architecture")
        self.causal = self.meta(f"{arch}.attention.causal") != "false"  # BERT-likes attend both ways: no generating
        # a recurrent state cannot be cut back part-way (no prefix reuse, no rejected drafts given back)
        self.recurrent = bool(lc.llama_model_is_recurrent(ptr) or lc.llama_model_is_hybrid(ptr))
        self.pooling = int(self.meta(f"{arch}.pooling_type") or lc.LLAMA_POOLING_TYPE_UNSPECIFIED)  # its own, if any
        self.reranks = self.pooling == lc.LLAMA_POOLING_TYPE_RANK  # it scores query-document pairs, nothing else
        self.n_cls_out = int(lc.llama_model_n_cls_out(ptr))  # a reranker's scores per input (its classifier's)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_model_free(self.ptr)
            self.ptr = None

    def _piece_table(self) -> list[bytes]:
        """Bytes of every token as text (control tokens render empty), so detokenizing is a list lookup."""
        buf = ctypes.create_string_buffer(256)
        out: list[bytes] = []
        for t in range(self.n_vocab):
            n = lc.llama_token_to_piece(self.vocab, t, buf, 256, 0, False)
            out.append(buf.raw[:n] if n > 0 else b"")
        return out

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, 4096)
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        raw = _utf8(text)
        cap = len(raw) + 8
        arr = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, raw, len(raw), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, raw, len(raw), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def grammar_sampler(self, grammar: str) -> Any:
        """llama.cpp's grammar sampler for the GBNF ``grammar`` (start rule ``root``); ``ValueError`` if it does not
        parse (llama.cpp prints why on stderr and returns NULL)."""
        ptr = lc.llama_sampler_init_grammar(self.vocab, _utf8(grammar), b"root")
        if not ptr:
            raise ValueError("the grammar does not parse as GBNF (llama.cpp's grammar syntax, start rule 'root'): "
                             "look for an undefined rule, left recursion, a syntax error or a repetition over 2000")
        return ptr

    def check_grammar(self, grammar: str) -> None:
        lc.llama_sampler_free(self.grammar_sampler(grammar))

    def chat_template(self, name: str | None = None) -> str | None:
        """The GGUF's chat template source (``name``: a named one, such as ``tool_use``), None if it has none."""
        tmpl = lc.llama_model_chat_template(self.ptr, None if name is None else name.encode())
        return tmpl.decode("utf-8", errors="replace") if tmpl else None

    @property
    def bos(self) -> int:
        """The BOS token's id (-1 when the model has none)."""
        return int(lc.llama_vocab_bos(self.vocab))

    def pair_markers(self) -> tuple[int, int, int]:
        """What a reranker puts around a query-document pair when its vocabulary asks for them: the BOS, EOS (the
        separator if it has no EOS) and separator token ids, each -1 when not asked for (llama.cpp's add flags)."""
        v = self.vocab
        eos = int(lc.llama_vocab_eos(v))
        eos = eos if eos >= 0 else int(lc.llama_vocab_sep(v))
        return (self.bos if self.add_bos else -1, eos if lc.llama_vocab_get_add_eos(v) else -1,
                int(lc.llama_vocab_sep(v)) if lc.llama_vocab_get_add_sep(v) else -1)

    def fim_tokens(self) -> tuple[int, int, int, int, int]:
        """The fill-in-the-middle token ids (prefix, suffix, middle, repository, file separator); -1 for none."""
        v = self.vocab
        return (int(lc.llama_vocab_fim_pre(v)), int(lc.llama_vocab_fim_suf(v)), int(lc.llama_vocab_fim_mid(v)),
                int(lc.llama_vocab_fim_rep(v)), int(lc.llama_vocab_fim_sep(v)))

    def special_piece(self, token: int) -> bytes:
        """The bytes of ``token`` with control tokens written out as their text (``<|im_start|>``), as a prompt's
        text shows them."""
        if self.pieces[token]:
            return self.pieces[token]
        buf = ctypes.create_string_buffer(256)
        n = lc.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        return buf.raw[:n] if n > 0 else b""

    def special_texts(self) -> tuple[str, str]:
        """The text of the BOS and EOS tokens, as chat templates write them (empty when the model has none)."""
        bos, eos = (self.special_piece(t).decode("utf-8", errors="replace") if t >= 0 else ""
                    for t in (self.bos, int(lc.llama_vocab_eos(self.vocab))))
        return bos, eos

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Format ``messages`` with the GGUF's own template (llama.cpp recognises the common families)."""
        tmpl = self.chat_template()
        if tmpl is None:
            arch = self.meta("general.architecture") or ""
            tmpl = ("llama2" if arch == "llama" and self.n_vocab == 32000 else
                    "gemma" if arch.startswith("gemma") else "chatml")  # Gemma's turn markers are its own tokens
            log.info("model has no chat template; using llama.cpp's built-in '%s' template", tmpl)
        keep = [(_utf8(m["role"]), _utf8(m["content"])) for m in messages]
        arr = (lc.llama_chat_message * len(keep))(*[lc.llama_chat_message(r, c) for r, c in keep])
        cap = max(256, 2 * sum(len(r) + len(c) for r, c in keep) + 256)
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = lc.llama_chat_apply_template(tmpl.encode(), arr, len(keep), add_generation_prompt, buf, cap)
            if n < 0:
                raise ValueError("the model's chat template is not supported by llama.cpp; use /v1/completions")
            if n <= cap:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = n + 1
        raise RuntimeError("chat template output kept growing")


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8; text that has none (a lone surrogate, which JSON's ``\\ud800`` escapes can carry) is
    refused with a ``ValueError`` naming where, instead of an encoding error."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the text is not valid Unicode: a lone surrogate (U+{ord(text[e.start]):04X}) at character "
                         f"{e.start}; send well-formed UTF-8") from None


# ---------------------------------------------------------------------------------------------------------------
# Batch: numpy-backed so a step fills it with a few array copies, not per-token Python work
# ---------------------------------------------------------------------------------------------------------------
class Batch(Native):
    """A ``llama_batch`` whose arrays are numpy buffers we own (one sequence id per token)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        base = self.seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *[ctypes.cast(base + 4 * i, ctypes.POINTER(ctypes.c_int32)) for i in range(capacity)]
        )
        struct: Any = lc.llama_batch()  # its fields are pointed at the numpy buffers below
        self.struct = struct
        struct.token = self.token.ctypes.data_as(ctypes.POINTER(lc.llama_token))
        struct.embd = None
        struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(lc.llama_pos))
        struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        struct.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(lc.llama_seq_id)))
        struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n_tokens = 0

    def close(self) -> None:  # numpy owns the memory; nothing native to free
        self.n_tokens = 0


# ---------------------------------------------------------------------------------------------------------------
# Context: KV cache + compute buffers for n_seq parallel sequences
# ---------------------------------------------------------------------------------------------------------------
class Context(KvMemory, Native):
    """A llama.cpp context over ``model`` with ``n_seq`` sequences of ``n_ctx_per_seq`` tokens each.

    With ``n_ctx`` given, the sequences share one cache of that many tokens instead. ``park`` more sequences of
    ``n_ctx_per_seq`` tokens each hold parked KV (:mod:`llamafleet.engine.kv_park`; never decoded, ids after the
    slots'). ``embeddings=True`` makes a
    context whose passes output every token's final hidden state (:meth:`embeddings`), unpooled, for
    :mod:`llamafleet.engine.embedding`; a reranker's output each sequence's scores instead (:meth:`sequence_scores`).
    """

    def __init__(self, model: Model, cfg: EngineConfig, n_ctx: int | None = None, embeddings: bool = False,
                 park: int = 0) -> None:
        if cfg.n_seq + park > max_parallel_sequences():
            raise ValueError(f"n_seq={cfg.n_seq} (+{park} parked) exceeds llama.cpp's limit of "
                             f"{max_parallel_sequences()} sequences")
        p = lc.llama_context_default_params()
        p.n_ctx = n_ctx or cfg.n_ctx_per_seq * (cfg.n_seq + park)
        if embeddings:  # every token's hidden state comes out, unpooled: the engine pools them itself (llama.cpp
            p.embeddings = True  # warns if the model names a pooling; unspecified is none, without the warning)
            p.pooling_type = lc.LLAMA_POOLING_TYPE_NONE if model.pooling > 0 else lc.LLAMA_POOLING_TYPE_UNSPECIFIED
            if model.pooling == lc.LLAMA_POOLING_TYPE_RANK:  # except a reranker's: its classifier runs in the graph
                p.pooling_type = lc.LLAMA_POOLING_TYPE_RANK  # on the pooled state (sequence_scores)
        p.n_batch = cfg.n_batch
        p.n_ubatch = min(cfg.n_ubatch, cfg.n_batch)
        p.n_seq_max = cfg.n_seq + park
        threads = cfg.n_threads or 0
        if threads > 0:
            p.n_threads = threads
            p.n_threads_batch = threads
        p.type_k = _KV_TYPE[cfg.kv_cache_type]
        p.type_v = _KV_TYPE[cfg.kv_cache_type]
        p.flash_attn_type = _FLASH[cfg.flash_attn]
        # False: one KV stream per sequence, so every slot is guaranteed its n_ctx_per_seq and attends only to
        # its own cells; True: one shared cache (what llama-server uses by default).
        p.kv_unified = cfg.kv_unified
        p.no_perf = False
        # Backend sampling: every slot carries a greedy chain that runs inside the graph, so plain greedy requests
        # need no logits copied to the host. A request that needs CPU sampling detaches its slot's chain.
        self._greedy: list[Any] = []
        if cfg.backend_sampling:
            self._greedy = [greedy_chain() for _ in range(cfg.n_seq)]
            confs = (lc.llama_sampler_seq_config * cfg.n_seq)()
            for i, ch in enumerate(self._greedy):
                confs[i].seq_id = i
                confs[i].sampler = ctypes.cast(ch, ctypes.c_void_p)
            self._confs = confs
            p.samplers = confs
            p.n_samplers = cfg.n_seq
        ptr = lc.llama_init_from_model(model.ptr, p)
        if not ptr:
            self.ptr = None
            self.close()
            raise RuntimeError(
                f"llama.cpp could not create a context of {p.n_ctx} tokens ({cfg.n_seq} x {cfg.n_ctx_per_seq}); "
                "lower --ctx or --parallel (see the llama_cpp log above)"
            )
        self.ptr = ptr
        self.n_vocab, self.n_embd = model.n_vocab, model.n_embd
        self.candidates, self.candidate = Candidates(model.n_vocab), Candidates(1)  # scratch for sampler chains
        self.n_ctx = int(lc.llama_n_ctx(ptr))
        self.memory = lc.llama_get_memory(ptr)
        self.copy_sources: set[int] = set()  # sequences copied from since the last decode (copies still queued)
        self.copy_targets: set[int] = set()  # ... and copied into (their data is not there yet)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_synchronize(self.ptr)  # a launched pass may still be running
            lc.llama_free(self.ptr)
            self.ptr = None
        for ch in self._greedy:
            lc.llama_sampler_free(ch)
        self._greedy = []

    @property
    def backend_sampling(self) -> bool:
        return bool(self._greedy)

    def use_backend_greedy(self, seq: int, on: bool) -> bool:
        """Attach (or detach) slot ``seq``'s in-graph greedy sampler; False if llama.cpp declined to offload it.

        A chain is initialised for the backend once, so re-attaching swaps in a fresh one (the old one is detached).
        """
        if not on:
            return bool(lc.llama_set_sampler(self.ptr, seq, None))
        lc.llama_sampler_free(self._greedy[seq])
        self._greedy[seq] = greedy_chain()
        return bool(lc.llama_set_sampler(self.ptr, seq, self._greedy[seq]))

    def sampled_token(self, batch_index: int) -> int:
        """The token the in-graph sampler chose for batch position ``batch_index`` in the last decode."""
        return int(lc.llama_get_sampled_token_ith(self.ptr, batch_index))

    def launch(self, batch: Batch) -> int:
        """Start one forward pass over ``batch``; returns llama.cpp's status (0 = ok).

        On a GPU ``llama_decode`` returns once the graph is queued, before it has run: the caller can do host work
        (the engine turns the previous step's tokens into text) and then :meth:`wait`. On the CPU it runs to the end.
        """
        batch.struct.n_tokens = batch.n_tokens
        self.copy_sources.clear()  # this decode applies the queued copies first
        self.copy_targets.clear()
        return int(lc.llama_decode(self.ptr, batch.struct))

    def wait(self) -> None:
        """Block until the last :meth:`launch` has finished and its logits are on the host."""
        lc.llama_synchronize(self.ptr)

    def logits(self, n_outputs: int) -> npt.NDArray[np.float32]:
        """The output rows of the last decode, in batch order, as a zero-copy ``(n_outputs, n_vocab)`` view."""
        ptr = lc.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.n_vocab))

    def embeddings(self, n_outputs: int) -> npt.NDArray[np.float32]:
        """The hidden states of the last decode's outputs, in batch order: a zero-copy ``(n_outputs, n_embd)`` view."""
        return np.ctypeslib.as_array(lc.llama_get_embeddings(self.ptr), shape=(n_outputs, self.n_embd))

    def sequence_scores(self, seq: int, n: int) -> npt.NDArray[np.float32]:
        """A reranker's ``n`` scores of sequence ``seq`` in the last decode (its pooled state through the classifier
        head), copied."""
        ptr = lc.llama_get_embeddings_seq(self.ptr, seq)
        if not ptr:
            raise RuntimeError(f"llama.cpp gave no scores for sequence {seq}")
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def perf(self) -> dict[str, float]:
        d = lc.llama_perf_context(self.ptr)
        return {"t_eval_ms": float(d.t_eval_ms), "n_eval": float(d.n_eval), "t_p_eval_ms": float(d.t_p_eval_ms)}
