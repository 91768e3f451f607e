# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin binding over native/include/colibri.h.

Owns the C handles and converts between C structs and Python values; no
policy lives here.  Every forward runs with the GIL released.  An Engine keeps
its Model alive; __dealloc__ is safe on a half-built or already-freed object.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

import numpy as np
cimport numpy as cnp

from colibri_lab import errors
from colibri_lab.params import SPEC_SOURCES as SPEC_SOURCE_NAMES, RequestParams

cnp.import_array()

cdef extern from "colibri.h" nogil:
    ctypedef struct cb_model:
        pass
    ctypedef struct cb_engine:
        pass

    enum:
        CB_OK, CB_ERR_IO, CB_ERR_FORMAT, CB_ERR_UNSUPPORTED, CB_ERR_NOMEM, CB_ERR_ARG,
        CB_ERR_FULL, CB_ERR_CONTEXT, CB_ERR_NOT_FOUND, CB_ERR_BUSY
    enum:
        CB_SIMD_AUTO, CB_SIMD_SCALAR, CB_SIMD_AVX2, CB_SIMD_AVX512
    enum:
        CB_MAX_LOGPROBS, CB_MAX_STOP
    enum:
        CB_EVENT_TOKEN, CB_EVENT_DONE, CB_EVENT_ERROR, CB_EVENT_SCORE

    const char *cb_status_str(int status)
    int cb_simd_detect()
    const char *cb_simd_name(int simd)
    int cb_amx_active()
    int cb_amx_enable(int on)
    int cb_prefetch_mode()
    int cb_prefetch_set(int mode)
    int cb_ymm_decode()
    int cb_ymm_decode_set(int mode)

    ctypedef struct cb_model_params:
        int validate_only
    cb_model_params cb_model_default_params()
    int cb_model_load(const char *path, const cb_model_params *params, cb_model **out, char *err, size_t err_len)
    void cb_model_free(cb_model *model)

    ctypedef struct cb_model_info:
        char arch[32]
        int n_vocab, n_ctx_train, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_rot, rope_neox
        float rope_freq_base, rope_freq_scale, norm_eps
        int tied_output, bos_id, eos_id, add_bos
        uint64_t n_params, weight_bytes
        int file_type, n_swa
    void cb_model_get_info(const cb_model *model, cb_model_info *info)

    int cb_model_meta_count(const cb_model *model)
    const char *cb_model_meta_key(const cb_model *model, int i, size_t *len)
    int cb_model_meta_type(const cb_model *model, int i)
    int cb_model_meta_arr_type(const cb_model *model, int i)
    uint64_t cb_model_meta_arr_len(const cb_model *model, int i)
    int cb_model_meta_int(const cb_model *model, int i, int64_t *out)
    int cb_model_meta_float(const cb_model *model, int i, double *out)
    const char *cb_model_meta_str(const cb_model *model, int i, size_t *len)
    const char *cb_model_meta_arr_str(const cb_model *model, int i, uint64_t j, size_t *len)
    int cb_model_meta_arr_int(const cb_model *model, int i, uint64_t j, int64_t *out)
    int cb_model_meta_arr_float(const cb_model *model, int i, uint64_t j, double *out)
    int cb_model_meta_find(const cb_model *model, const char *key)
    int cb_model_tensor_count(const cb_model *model)
    const char *cb_model_tensor_name(const cb_model *model, int i, size_t *len)
    int cb_model_tensor_type(const cb_model *model, int i)
    int cb_model_tensor_dims(const cb_model *model, int i, int64_t ne[4])
    const uint8_t *cb_model_token_bytes(const cb_model *model, int token, size_t *len)
    int cb_model_token_type(const cb_model *model, int token)
    int cb_model_token_is_eog(const cb_model *model, int token)

    ctypedef struct cb_engine_params:
        int n_slots, n_ctx, n_threads, n_batch, n_chunk, simd, prefix_reuse, kv_f16
        float prompt_slack
        const cb_model *draft_model
        const cb_model *xdraft_model
        int layer_skip
        const int32_t *skip_layers
        int n_skip_layers

    enum:
        CB_SPEC_GRAMMAR, CB_SPEC_LOOKUP, CB_SPEC_DRAFT, CB_SPEC_LAYERSKIP, CB_SPEC_XDRAFT, CB_SPEC_N_SOURCES, CB_SPEC_MAX_K
    ctypedef struct cb_spec_params:
        int sources, k_max, adaptive, ngram_max, ngram_min
    cb_spec_params cb_spec_default_params()
    ctypedef struct cb_spec_stats:
        int64_t drafts, draft_tokens, accepted_tokens
        int64_t tried_pos[16]
        int64_t accepted_pos[16]
        double accept_rate_pos[16]
        int k
        double expected_gain
        int paused
        int64_t decisions, declined
        double decline_rate
        double draft_ms
    int cb_engine_spec_stats(const cb_engine *engine, int source, cb_spec_stats *out)
    cb_engine_params cb_engine_default_params()
    int cb_engine_new(const cb_model *model, const cb_engine_params *params, cb_engine **out, char *err, size_t err_len)
    void cb_engine_free(cb_engine *engine)
    void cb_engine_get_params(const cb_engine *engine, cb_engine_params *params)

    ctypedef struct cb_grammar:
        pass
    ctypedef struct cb_matcher:
        pass
    int cb_grammar_compile(const cb_model *model, const char *text, size_t len, cb_grammar **out, char *err, size_t err_len)
    void cb_grammar_free(cb_grammar *grammar)
    int cb_matcher_new(const cb_grammar *grammar, cb_matcher **out)
    void cb_matcher_free(cb_matcher *m)
    int cb_matcher_fill_mask(cb_matcher *m, uint32_t *mask)
    int cb_matcher_fill_mask_budget(cb_matcher *m, uint32_t *mask, int budget)
    int cb_matcher_min_completion(const cb_matcher *m)
    int cb_matcher_accept(cb_matcher *m, int token)
    int cb_matcher_rollback(cb_matcher *m, int n)
    int cb_matcher_is_accepting(const cb_matcher *m)
    int cb_matcher_forced_bytes(const cb_matcher *m, uint8_t *out, int cap)

    ctypedef struct cb_sampling_params:
        float temperature
        int top_k
        float top_p, min_p, repeat_penalty
        int repeat_last_n
        float presence_penalty, frequency_penalty
        uint64_t seed
        int n_logprobs, n_logit_bias
        const int32_t *logit_bias_tokens
        const float *logit_bias_values
    ctypedef struct cb_request_params:
        const int32_t *tokens
        int n_tokens, slot, max_tokens, ignore_eos, n_stop
        const char *stop[8]
        size_t stop_len[8]
        int return_logits, copy_prefix, score
        const cb_grammar *grammar
        cb_spec_params spec
        cb_sampling_params sampling
    cb_request_params cb_request_default_params()

    ctypedef struct cb_request_metrics:
        int prompt_tokens, cached_tokens, completion_tokens
        double queue_ms, ttft_ms, prefill_ms, decode_ms, e2e_ms, tpot_ms, decode_tok_s
        int draft_n, draft_accepted, draft_steps
        int draft_n_source[5]
        int draft_accepted_source[5]
        int draft_n_pos[16]
        int draft_accepted_pos[16]
        double draft_ms
        int64_t experts_routed
        int experts_unique
        double grammar_mask_us
        int slot, finish_reason, stop_offset
    ctypedef struct cb_score_rows:
        int pos, n, n_top
        const float *logprob
        const int32_t *argmax
        const int32_t *top_tokens
        const float *top_logprobs
        const float *logits
    ctypedef struct cb_event:
        int type
        int64_t id
        int32_t token
        float logprob
        int n_top
        int32_t top_tokens[20]
        float top_logprobs[20]
        const float *logits
        int drafted
        cb_score_rows score
        cb_request_metrics metrics
        int status
        char message[160]
    const char *cb_finish_str(int finish)
    int cb_engine_submit(cb_engine *engine, const cb_request_params *req, int64_t *id_out, char *err, size_t err_len)
    int cb_engine_cancel(cb_engine *engine, int64_t id)
    int cb_engine_step(cb_engine *engine, cb_event *events, int max_events)
    int cb_engine_pending(const cb_engine *engine)

    ctypedef struct cb_step_stats:
        int64_t step
        int rows_decode, rows_prefill, n_running
        double step_ms, matmul_ms, attention_ms, lm_head_ms, sampling_ms, grammar_ms, draft_ms, other_ms
        int64_t experts_unique, experts_routed
        double norm_ms, rope_ms, sync_ms
        double matmul_type_ms[32]
    void cb_engine_last_step(const cb_engine *engine, cb_step_stats *stats)
    void cb_model_moe_info(const cb_model *model, int *n_expert, int *n_expert_used, int *n_ff_exp)
    int cb_engine_expert_counts(const cb_engine *engine, int64_t *out, int64_t cap)
    int cb_engine_route_trace(cb_engine *engine, const char *path, char *err, size_t err_len)
    int cb_engine_tokenize_bytes(const cb_engine *engine, const uint8_t *bytes, size_t n, int32_t *out, int cap)
    int cb_engine_slot_info(const cb_engine *engine, int slot, int *n_past, int *busy)
    int cb_engine_slot_tokens(const cb_engine *engine, int slot, int32_t *out, int cap)
    size_t cb_engine_kv_bytes(const cb_engine *engine)
    int cb_engine_slot_clear(cb_engine *engine, int slot)
    int cb_engine_forward(cb_engine *engine, int slot, const int32_t *tokens, int n, int pos,
                          float *logits_out, char *err, size_t err_len)
    int cb_engine_forward_argmax(cb_engine *engine, int slot, const int32_t *tokens, int n, int pos,
                                 const uint8_t *skip, int32_t *argmax_out, char *err, size_t err_len)

    int cb_kernel_matmul(int type, const void *w, int n_out, int n_in, const float *x, int n_rows,
                         float *y, int simd, int n_threads)
    size_t cb_type_size(int type, int64_t n)
    const char *cb_type_name(int type)


DEF ERR_LEN = 512
DEF EVENT_CAP = 512

SPEC_SOURCES = {"grammar": CB_SPEC_GRAMMAR, "prompt_lookup": CB_SPEC_LOOKUP, "draft": CB_SPEC_DRAFT,
                "layer_skip": CB_SPEC_LAYERSKIP, "cross_vocab": CB_SPEC_XDRAFT}
SPEC_SOURCE_ORDER = SPEC_SOURCE_NAMES  # bit order = priority order (colibri_lab.params)
MAX_LOGPROBS = CB_MAX_LOGPROBS   # most alternatives per token (sampling logprobs, scoring top)

SIMD_NAMES = {"scalar": CB_SIMD_SCALAR, "avx2": CB_SIMD_AVX2, "avx512": CB_SIMD_AVX512, "auto": CB_SIMD_AUTO}


def _raise(int status, message):
    """Raise the typed exception for a negative cb_status (errors.STATUS)."""
    raise errors.from_status(status, message or cb_status_str(status).decode())


cdef str _err_str(char *err):
    return err[:].decode("utf-8", "replace")


def simd_detect():
    """Name of the best SIMD level this CPU supports."""
    return cb_simd_name(cb_simd_detect()).decode()


def simd_available():
    """SIMD levels usable here, from slowest to fastest ("scalar" always)."""
    best = cb_simd_detect()
    return [name for name, lvl in (("scalar", CB_SIMD_SCALAR), ("avx2", CB_SIMD_AVX2), ("avx512", CB_SIMD_AVX512))
            if lvl <= best]


def amx_active():
    """True if the K-quant matmuls of 16 rows and more (prefill) run on AMX
    int8 tiles at the avx512 level: the CPU has them, the OS grants them, and
    neither COLIBRI_LAB_AMX=0 nor set_amx(False) turned them off.  Results are
    bit-identical either way; only the speed differs."""
    return bool(cb_amx_active())


def set_amx(bint on):
    """Turn the AMX tiles on (where available) or off for the whole process,
    from the next matmul on (an A/B switch); returns amx_active()."""
    return bool(cb_amx_enable(1 if on else 0))


def ymm_decode():
    """True if decode's Q4_K matmuls (one or two rows) at the avx512 level
    run the 256-bit kernel instead of the 512-bit one: by default on CPUs that
    split each 512-bit operation in two (AMD Zen 4), where it streams faster.
    Results are bit-identical either way; only the speed differs."""
    return bool(cb_ymm_decode())


def set_ymm_decode(on):
    """Run decode's Q4_K matmuls on the 256-bit kernel always (True), never
    (False) or as the CPU decides (None), for the whole process from the next
    matmul on (an A/B switch); returns ymm_decode()."""
    if on is not None and not isinstance(on, bool):
        raise errors.InvalidRequestError(f"set_ymm_decode takes True, False or None, got {on!r}")
    return bool(cb_ymm_decode_set(-1 if on is None else int(on)))


_PREFETCH_MODES = {"auto": -1, "off": 0, "on": 1}


def prefetch_mode():
    """The panel kernels' software-prefetch mode: "auto" (by CPU vendor: always
    on Intel and unknown CPUs; on AMD not for matmuls of one or two rows of
    types other than Q4_K and Q5_K, nor one row of Q4_K on the kernel of
    ymm_decode(), whose panels the hardware prefetcher streams faster alone),
    "on" (always) or "off" (never).
    COLIBRI_LAB_PREFETCH=0 / 1 sets it at start.  Results are bit-identical in
    every mode; only the speed differs."""
    m = cb_prefetch_mode()
    return next(k for k, v in _PREFETCH_MODES.items() if v == m)


def set_prefetch(mode):
    """Set the software-prefetch mode ("auto", "on", "off") for the whole
    process, from the next matmul on (an A/B switch); returns prefetch_mode()."""
    if mode not in _PREFETCH_MODES:
        raise errors.InvalidRequestError(f"prefetch mode must be one of {sorted(_PREFETCH_MODES)}, got {mode!r}")
    cb_prefetch_set(_PREFETCH_MODES[mode])
    return prefetch_mode()


cdef int _simd_level(simd) except? -2:
    if isinstance(simd, int):
        return simd
    try:
        return SIMD_NAMES[simd]
    except KeyError:
        raise errors.InvalidRequestError(f"unknown SIMD level {simd!r}; expected one of {sorted(SIMD_NAMES)}")


def type_size(int type_id, int64_t n):
    """Bytes of n elements of a GGML type (0 if unknown)."""
    return cb_type_size(type_id, n)


def type_name(int type_id):
    return cb_type_name(type_id).decode()


def kernel_matmul(int type_id, w, int n_out, int n_in, x, simd="scalar", int n_threads=1):
    """y = x @ W.T through the engine's kernel for `simd`, W given as raw GGUF blocks."""
    cdef int level = _simd_level(simd)
    if level != CB_SIMD_SCALAR and level > cb_simd_detect():
        raise errors.InvalidRequestError(f"SIMD level {simd!r} is not available on this CPU")
    cdef const uint8_t[::1] wv = np.ascontiguousarray(np.frombuffer(memoryview(w).cast("B"), dtype=np.uint8))
    cdef cnp.ndarray xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim == 1:
        xa = xa.reshape(1, -1)
    if xa.ndim != 2 or xa.shape[1] != n_in:
        raise errors.InvalidRequestError(f"x must have shape [n_rows, {n_in}], got {x.shape}")
    cdef size_t need = cb_type_size(type_id, n_in) * n_out
    if need == 0 or <size_t>wv.shape[0] != need:
        raise errors.InvalidRequestError(f"w has {wv.shape[0]} bytes, expected {need} for {n_out} rows of {n_in} of type {type_id}")
    cdef int n_rows = xa.shape[0]
    cdef cnp.ndarray[cnp.float32_t, ndim=2] y = np.zeros((n_rows, n_out), dtype=np.float32)
    cdef int rc
    cdef const void *wp = &wv[0]
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef float *yp = <float *>cnp.PyArray_DATA(y)
    with nogil:
        rc = cb_kernel_matmul(type_id, wp, n_out, n_in, xp, n_rows, yp, level, n_threads)
    if rc != CB_OK:
        _raise(rc, f"kernel_matmul failed: {cb_status_str(rc).decode()}")
    return y


cdef class Model:
    """A GGUF file mapped read-only and validated.  Immutable once loaded."""
    cdef cb_model *ptr
    cdef readonly str path
    cdef dict _info

    def __cinit__(self):
        self.ptr = NULL

    def __init__(self, path, validate_only=False):
        cdef bytes bpath = str(path).encode()
        cdef char err[ERR_LEN]
        cdef cb_model_params p = cb_model_default_params()
        cdef const char *cpath = bpath
        cdef int rc
        err[0] = 0
        p.validate_only = 1 if validate_only else 0
        with nogil:
            rc = cb_model_load(cpath, &p, &self.ptr, err, ERR_LEN)
        if rc != CB_OK:
            _raise(rc, f"{path}: {_err_str(err)}")
        self.path = str(path)

    def __dealloc__(self):
        if self.ptr != NULL:
            cb_model_free(self.ptr)
            self.ptr = NULL

    cdef _check(self):
        if self.ptr == NULL:
            raise errors.ColibriError("model is not loaded")

    @property
    def info(self):
        """Hyperparameters as a dict (cb_model_info)."""
        self._check()
        cdef cb_model_info i
        cdef int ne, nu, nf
        if self._info is None:
            cb_model_get_info(self.ptr, &i)
            self._info = dict(
                arch=i.arch.decode(), n_vocab=i.n_vocab, n_ctx_train=i.n_ctx_train, n_embd=i.n_embd,
                n_ff=i.n_ff, n_layer=i.n_layer, n_head=i.n_head, n_head_kv=i.n_head_kv,
                head_dim=i.head_dim, n_rot=i.n_rot, rope_neox=bool(i.rope_neox),
                rope_freq_base=i.rope_freq_base, rope_freq_scale=i.rope_freq_scale, norm_eps=i.norm_eps,
                tied_output=bool(i.tied_output), bos_id=i.bos_id, eos_id=i.eos_id, add_bos=bool(i.add_bos),
                n_params=i.n_params, weight_bytes=i.weight_bytes, file_type=i.file_type,
                n_swa=i.n_swa)
            cb_model_moe_info(self.ptr, &ne, &nu, &nf)
            self._info.update(n_expert=ne, n_expert_used=nu, n_ff_exp=nf)
        return dict(self._info)

    @property
    def n_vocab(self):
        return self.info["n_vocab"]

    cdef object _meta_value(self, int i):
        cdef int t = cb_model_meta_type(self.ptr, i)
        cdef int64_t iv
        cdef double fv
        cdef size_t n
        cdef const char *s
        cdef uint64_t j, alen
        cdef int at
        if t == 8:
            s = cb_model_meta_str(self.ptr, i, &n)
            return s[:n].decode("utf-8", "replace")
        if t in (6, 12):
            cb_model_meta_float(self.ptr, i, &fv)
            return fv
        if t == 7:
            cb_model_meta_int(self.ptr, i, &iv)
            return bool(iv)
        if t == 9:
            at = cb_model_meta_arr_type(self.ptr, i)
            alen = cb_model_meta_arr_len(self.ptr, i)
            out = []
            for j in range(alen):
                if at == 8:
                    s = cb_model_meta_arr_str(self.ptr, i, j, &n)
                    out.append(s[:n].decode("utf-8", "replace"))
                elif at in (6, 12):
                    cb_model_meta_arr_float(self.ptr, i, j, &fv)
                    out.append(fv)
                else:
                    cb_model_meta_arr_int(self.ptr, i, j, &iv)
                    out.append(bool(iv) if at == 7 else iv)
            return out
        cb_model_meta_int(self.ptr, i, &iv)
        return iv

    def metadata(self, keys=None):
        """GGUF metadata as a dict (arrays as lists).  `keys` limits it to those present."""
        self._check()
        cdef int i
        cdef size_t n
        cdef const char *k
        out = {}
        if keys is not None:
            for key in keys:
                i = cb_model_meta_find(self.ptr, key.encode())
                if i >= 0:
                    out[key] = self._meta_value(i)
            return out
        for i in range(cb_model_meta_count(self.ptr)):
            k = cb_model_meta_key(self.ptr, i, &n)
            out[k[:n].decode("utf-8", "replace")] = self._meta_value(i)
        return out

    def tensors(self):
        """[(name, type name, shape)] in file order (GGUF dims, innermost first)."""
        self._check()
        cdef int64_t ne[4]
        cdef size_t n
        cdef const char *name
        out = []
        for i in range(cb_model_tensor_count(self.ptr)):
            nd = cb_model_tensor_dims(self.ptr, i, ne)
            name = cb_model_tensor_name(self.ptr, i, &n)
            out.append((name[:n].decode("utf-8", "replace"), cb_type_name(cb_model_tensor_type(self.ptr, i)).decode(),
                        tuple(ne[d] for d in range(nd))))
        return out

    def token_bytes(self, int token):
        """Raw bytes of a token (byte-level BPE decoded in C)."""
        self._check()
        cdef size_t n
        cdef const uint8_t *p = cb_model_token_bytes(self.ptr, token, &n)
        if p == NULL:
            raise errors.InvalidRequestError(f"token id {token} is out of range [0, {self.n_vocab})")
        return p[:n]

    def token_type(self, int token):
        self._check()
        return cb_model_token_type(self.ptr, token)

    def token_is_eog(self, int token):
        self._check()
        return bool(cb_model_token_is_eog(self.ptr, token))

    def detokenize_bytes(self, tokens):
        """Concatenated raw bytes of token ids."""
        self._check()
        cdef size_t n
        cdef const uint8_t *p
        parts = []
        for t in tokens:
            p = cb_model_token_bytes(self.ptr, t, &n)
            if p == NULL:
                raise errors.InvalidRequestError(f"token id {t} is out of range [0, {self.n_vocab})")
            parts.append(p[:n])
        return b"".join(parts)



cdef extern from "grammar.h" nogil:
    ctypedef struct cb_matcher_stats:
        uint64_t mask_calls
        uint64_t mask_cache_hits
        uint64_t shared_hits
        uint64_t trie_nodes
        uint64_t transitions
        uint64_t gcs
        uint64_t budget_walks
        uint64_t plain_masks
        uint32_t n_states
        uint32_t trie_size
    void cb_matcher_get_stats(const cb_matcher *m, cb_matcher_stats *out)

cdef class Grammar:
    """A GBNF grammar compiled against a model's vocabulary; reusable across requests."""
    cdef cb_grammar *ptr
    cdef readonly Model model
    cdef readonly str text

    def __cinit__(self):
        self.ptr = NULL

    def __init__(self, Model model not None, str text):
        model._check()
        cdef bytes b = text.encode("utf-8")
        cdef const char *p = b
        cdef size_t n = len(b)
        cdef char err[ERR_LEN]
        cdef int rc
        err[0] = 0
        with nogil:
            rc = cb_grammar_compile(model.ptr, p, n, &self.ptr, err, ERR_LEN)
        if rc != CB_OK:
            raise errors.GrammarError(_err_str(err) or cb_status_str(rc).decode())
        self.model = model
        self.text = text

    def __dealloc__(self):
        if self.ptr != NULL:
            cb_grammar_free(self.ptr)
            self.ptr = NULL

    def matcher(self):
        return Matcher(self)


cdef class Matcher:
    """Per-sequence grammar state (for tests and tools; the engine keeps its own per request)."""
    cdef cb_matcher *ptr
    cdef readonly Grammar grammar
    cdef int n_vocab

    def __cinit__(self):
        self.ptr = NULL

    def __init__(self, Grammar grammar not None):
        rc = cb_matcher_new(grammar.ptr, &self.ptr)
        if rc != CB_OK:
            _raise(rc, "could not create a grammar matcher")
        self.grammar = grammar
        self.n_vocab = grammar.model.n_vocab

    def __dealloc__(self):
        if self.ptr != NULL:
            cb_matcher_free(self.ptr)
            self.ptr = NULL

    def fill_mask(self, int budget=-1):
        """Boolean array [n_vocab]: True where the token may come next.  With
        budget >= 0: and the output can still be completed within `budget`
        more tokens after this one."""
        cdef cnp.ndarray[cnp.uint32_t, ndim=1] words = np.zeros((self.n_vocab + 31) // 32, dtype=np.uint32)
        rc = cb_matcher_fill_mask_budget(self.ptr, <uint32_t *>cnp.PyArray_DATA(words), budget)
        if rc < 0:
            _raise(rc, "fill_mask failed")
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        return bits[:self.n_vocab].astype(bool)

    def fill_mask_words(self, cnp.ndarray[cnp.uint32_t, ndim=1] words not None, int budget=-1):
        """Write the mask into a caller-owned uint32 array of (n_vocab + 31) // 32
        words (bit t of word t >> 5 = token t allowed), no copy; returns the number
        of allowed tokens.  For benchmarks and tools that keep one buffer."""
        if words.shape[0] < (self.n_vocab + 31) // 32 or not words.flags.c_contiguous:
            raise errors.InvalidRequestError("words must be a contiguous uint32 array of (n_vocab + 31) // 32")
        rc = cb_matcher_fill_mask_budget(self.ptr, <uint32_t *>cnp.PyArray_DATA(words), budget)
        if rc < 0:
            _raise(rc, "fill_mask failed")
        return rc

    def accept(self, int token):
        rc = cb_matcher_accept(self.ptr, token)
        if rc != CB_OK:
            raise errors.InvalidRequestError(f"token {token} is not allowed by the grammar here")

    def rollback(self, int n):
        rc = cb_matcher_rollback(self.ptr, n)
        if rc != CB_OK:
            raise errors.InvalidRequestError(f"cannot roll back {n} tokens")

    @property
    def is_accepting(self):
        return bool(cb_matcher_is_accepting(self.ptr))

    @property
    def min_completion(self):
        """Bytes in the shortest completion of the output so far (0 when accepting)."""
        return cb_matcher_min_completion(self.ptr)

    def stats(self):
        """The matcher's counters (cb_matcher_stats, grammar.h) as a dict: for tests and benchmarks."""
        cdef cb_matcher_stats st
        cb_matcher_get_stats(self.ptr, &st)
        return dict(mask_calls=st.mask_calls, mask_cache_hits=st.mask_cache_hits, shared_hits=st.shared_hits,
                    trie_nodes=st.trie_nodes, transitions=st.transitions, gcs=st.gcs,
                    budget_walks=st.budget_walks, plain_masks=st.plain_masks, n_states=st.n_states,
                    trie_size=st.trie_size)

    def forced_bytes(self, int cap=4096):
        cdef cnp.ndarray[cnp.uint8_t, ndim=1] buf = np.zeros(max(cap, 1), dtype=np.uint8)
        cdef int n = cb_matcher_forced_bytes(self.ptr, <uint8_t *>cnp.PyArray_DATA(buf), cap)
        return buf[:max(n, 0)].tobytes()


cdef dict _metrics_dict(const cb_request_metrics *m):
    """The C fields of cb_request_metrics (colibri_lab.metrics.REQUEST, origin "c");
    derived metrics are computed in colibri_lab.metrics, not here."""
    cdef int n = CB_SPEC_MAX_K
    while n > 0 and m.draft_n_pos[n - 1] == 0:  # trailing positions never tried
        n -= 1
    return dict(
        prompt_tokens=m.prompt_tokens, cached_tokens=m.cached_tokens, completion_tokens=m.completion_tokens,
        queue_ms=m.queue_ms, ttft_ms=m.ttft_ms, prefill_ms=m.prefill_ms, decode_ms=m.decode_ms, e2e_ms=m.e2e_ms,
        tpot_ms=m.tpot_ms, decode_tok_s=m.decode_tok_s, draft_n=m.draft_n, draft_accepted=m.draft_accepted,
        draft_steps=m.draft_steps,
        draft_n_by_pos=[m.draft_n_pos[i] for i in range(n)],
        draft_accepted_by_pos=[m.draft_accepted_pos[i] for i in range(n)],
        draft_n_by_source={SPEC_SOURCE_ORDER[b]: m.draft_n_source[b] for b in range(CB_SPEC_N_SOURCES)
                           if m.draft_n_source[b]},
        draft_accepted_by_source={SPEC_SOURCE_ORDER[b]: m.draft_accepted_source[b] for b in range(CB_SPEC_N_SOURCES)
                                  if m.draft_n_source[b]},
        draft_ms=m.draft_ms, grammar_mask_us=m.grammar_mask_us, experts_routed=m.experts_routed, experts_unique=m.experts_unique,
        slot=m.slot, finish_reason=cb_finish_str(m.finish_reason).decode(), stop_offset=m.stop_offset)


cdef dict _score_dict(const cb_event *ev, int n_vocab):
    """A SCORE event as numpy arrays (copies: the C rows live until the next step)."""
    cdef const cb_score_rows *s = &ev.score
    cdef int n = s.n, k = s.n_top
    cdef cnp.ndarray lp = np.empty(n, dtype=np.float32)
    cdef cnp.ndarray am = np.empty(n, dtype=np.int32)
    cdef cnp.ndarray tt = np.empty((n, k), dtype=np.int32)
    cdef cnp.ndarray tl = np.empty((n, k), dtype=np.float32)
    memcpy(cnp.PyArray_DATA(lp), s.logprob, n * sizeof(float))
    memcpy(cnp.PyArray_DATA(am), s.argmax, n * sizeof(int32_t))
    if k > 0:
        memcpy(cnp.PyArray_DATA(tt), s.top_tokens, n * k * sizeof(int32_t))
        memcpy(cnp.PyArray_DATA(tl), s.top_logprobs, n * k * sizeof(float))
    d = {"type": "score", "id": ev.id, "pos": s.pos, "logprob": lp, "argmax": am, "top_tokens": tt,
         "top_logprobs": tl}
    cdef cnp.ndarray lg
    if s.logits != NULL:
        lg = np.empty((n, n_vocab), dtype=np.float32)
        memcpy(cnp.PyArray_DATA(lg), s.logits, <size_t>n * n_vocab * sizeof(float))
        d["logits"] = lg
    return d


cdef class Engine:
    """KV slots, a thread pool and the step loop over one Model.

    Not thread-safe: one thread drives it (colibri_lab.scheduler does)."""
    cdef cb_engine *ptr
    cdef cb_event *events
    cdef readonly Model model
    cdef int n_vocab
    cdef bint in_step        # a thread is inside cb_engine_step / cb_engine_forward (GIL released)
    cdef bint close_pending  # close() came during that call: the caller frees when it returns
    cdef dict _keep   # request id -> objects C points into (grammars) until the request ends

    def __cinit__(self):
        self.ptr = NULL
        self.events = NULL
        self._keep = {}
        self.in_step = False
        self.close_pending = False

    cdef readonly Model draft_model
    cdef readonly Model xdraft_model

    def __init__(self, Model model not None, int n_slots=1, int n_ctx=0, int n_threads=0, int n_batch=0,
                 int n_chunk=0, simd="auto", prefix_reuse=True, Model draft_model=None, layer_skip=False,
                 skip_layers=None, kv_f16=True, Model xdraft_model=None, prompt_slack=None):
        model._check()
        cdef cb_engine_params p = cb_engine_default_params()
        cdef cnp.ndarray[cnp.int32_t, ndim=1] skip = np.asarray(list(skip_layers or []), dtype=np.int32)
        if draft_model is not None:
            draft_model._check()
            p.draft_model = draft_model.ptr
        if xdraft_model is not None:
            xdraft_model._check()
            p.xdraft_model = xdraft_model.ptr
        p.layer_skip = 1 if (layer_skip or skip_layers) else 0
        if skip_layers:
            p.skip_layers = <const int32_t *>cnp.PyArray_DATA(skip)
            p.n_skip_layers = skip.shape[0]
        cdef char err[ERR_LEN]
        cdef int rc
        err[0] = 0
        p.n_slots = n_slots
        p.n_ctx = n_ctx
        p.n_threads = n_threads
        p.n_batch = n_batch
        p.n_chunk = n_chunk
        if prompt_slack is not None:   # None: the C default (cb_engine_default_params)
            p.prompt_slack = float(prompt_slack)
        p.simd = _simd_level(simd)
        if p.simd > cb_simd_detect():
            raise errors.InvalidRequestError(f"SIMD level {simd!r} is not available on this CPU (it has {simd_available()})")
        p.prefix_reuse = 1 if prefix_reuse else 0
        p.kv_f16 = 1 if kv_f16 else 0
        with nogil:
            rc = cb_engine_new(model.ptr, &p, &self.ptr, err, ERR_LEN)
        if rc != CB_OK:
            _raise(rc, _err_str(err))
        self.model = model
        self.draft_model = draft_model
        self.xdraft_model = xdraft_model
        self.n_vocab = model.n_vocab
        self.events = <cb_event *>malloc(EVENT_CAP * sizeof(cb_event))
        if self.events == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.ptr != NULL:
            cb_engine_free(self.ptr)
            self.ptr = NULL
        if self.events != NULL:
            free(self.events)
            self.events = NULL

    def close(self):
        """Free the engine (KV cache, threads); the object becomes unusable.  Called
        while another thread is inside step() or forward(), it only marks the
        engine: that call frees it when the C step returns, never under it."""
        if self.in_step:
            self.close_pending = True
        else:
            self._free()

    cdef _free(self):
        self.close_pending = False
        if self.ptr != NULL:
            cb_engine_free(self.ptr)
            self.ptr = NULL

    cdef _check(self):
        if self.ptr == NULL:
            raise errors.ColibriError("engine is closed")
        if self.in_step:
            raise errors.ColibriError("engine is being stepped by another thread; submit through the scheduler")

    @property
    def params(self):
        if self.ptr == NULL:
            raise errors.ColibriError("engine is closed")
        cdef cb_engine_params p
        cb_engine_get_params(self.ptr, &p)
        names = {CB_SIMD_SCALAR: "scalar", CB_SIMD_AVX2: "avx2", CB_SIMD_AVX512: "avx512"}
        return dict(n_slots=p.n_slots, n_ctx=p.n_ctx, n_threads=p.n_threads, n_batch=p.n_batch,
                    n_chunk=p.n_chunk, simd=names.get(p.simd, str(p.simd)), prefix_reuse=bool(p.prefix_reuse),
                    kv_f16=bool(p.kv_f16), prompt_slack=float(p.prompt_slack))

    @property
    def kv_bytes(self):
        """Bytes of the KV cache (keys and values, every slot)."""
        if self.ptr == NULL:
            raise errors.ColibriError("engine is closed")
        return cb_engine_kv_bytes(self.ptr)

    def submit(self, tokens, params=None, **kw):
        """Queue a request; returns its id.  `params` is a colibri_lab.params.RequestParams,
        copied as it is; without it the keywords build one (its defaults and bounds).
        score=True: teacher-forced scoring of the prompt; "score" events carry, per
        step, log p(prompt[i+1] | prompt[..i]) for a run of positions i (top
        n_logprobs alternatives each, raw logits rows with return_logits)."""
        self._check()
        if params is None:
            params = RequestParams.from_kwargs(**kw)
        elif kw:
            raise errors.InvalidRequestError("give either a RequestParams or keywords, not both")
        cdef cnp.ndarray[cnp.int32_t, ndim=1] toks = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        cdef cb_request_params r = cb_request_default_params()
        cdef char err[ERR_LEN]
        cdef int64_t rid = 0
        cdef int rc, i
        err[0] = 0
        stops = params.stop
        bias = params.logit_bias
        cdef cnp.ndarray[cnp.int32_t, ndim=1] btok = np.array(list(bias.keys()), dtype=np.int32)
        cdef cnp.ndarray[cnp.float32_t, ndim=1] bval = np.array(list(bias.values()), dtype=np.float32)
        if toks.shape[0] == 0:
            raise errors.InvalidRequestError("a request needs at least one prompt token")
        r.tokens = <const int32_t *>cnp.PyArray_DATA(toks)
        r.n_tokens = toks.shape[0]
        r.slot = params.slot
        r.max_tokens = params.max_tokens
        r.ignore_eos = params.ignore_eos
        r.return_logits = params.return_logits
        r.copy_prefix = params.copy_prefix
        r.score = params.score
        cdef Grammar grammar = None
        if params.grammar is not None:
            if not isinstance(params.grammar, Grammar):
                raise errors.InvalidRequestError("grammar must be a compiled Grammar (Engine.compile_grammar)")
            grammar = params.grammar
            if grammar.model is not self.model:
                raise errors.InvalidRequestError("the grammar was compiled for a different model")
            r.grammar = grammar.ptr
        sp = params.speculative
        if sp is not None and sp.sources:
            r.spec.sources = 0
            for name in sp.sources:
                r.spec.sources |= SPEC_SOURCES[name]
            r.spec.k_max = sp.k_max
            r.spec.adaptive = 1 if sp.adaptive else 0
            r.spec.ngram_max = sp.ngram_max
            r.spec.ngram_min = sp.ngram_min
        r.n_stop = len(stops)
        for i in range(len(stops)):
            r.stop[i] = <const char *>stops[i]
            r.stop_len[i] = len(stops[i])
        r.sampling.temperature = params.temperature
        r.sampling.top_k = params.top_k
        r.sampling.top_p = params.top_p
        r.sampling.min_p = params.min_p
        r.sampling.repeat_penalty = params.repeat_penalty
        r.sampling.repeat_last_n = params.repeat_last_n
        r.sampling.presence_penalty = params.presence_penalty
        r.sampling.frequency_penalty = params.frequency_penalty
        r.sampling.seed = <uint64_t>params.seed
        r.sampling.n_logprobs = params.n_logprobs
        r.sampling.n_logit_bias = len(bias)
        if len(bias):
            r.sampling.logit_bias_tokens = <const int32_t *>cnp.PyArray_DATA(btok)
            r.sampling.logit_bias_values = <const float *>cnp.PyArray_DATA(bval)
        rc = cb_engine_submit(self.ptr, &r, &rid, err, ERR_LEN)
        if rc != CB_OK:
            _raise(rc, _err_str(err))
        if grammar is not None:
            self._keep[rid] = grammar
        return rid

    def cancel(self, int64_t request_id):
        """Cancel a request; it finishes with reason 'cancelled' at the next step.  False if unknown."""
        self._check()
        return cb_engine_cancel(self.ptr, request_id) == CB_OK

    @property
    def pending(self):
        """Requests queued or running."""
        if self.ptr == NULL:
            return 0
        return cb_engine_pending(self.ptr)

    def step(self):
        """One scheduling step (GIL released); returns the list of event dicts."""
        self._check()
        cdef int n
        self.in_step = True
        try:
            with nogil:
                n = cb_engine_step(self.ptr, self.events, EVENT_CAP)
        finally:
            self.in_step = False
        try:
            return self._events_out(n)
        finally:   # events point into the engine (logits): freed only once they are copied
            if self.close_pending:
                self._free()

    cdef list _events_out(self, int n):
        cdef int i, j
        cdef cb_event *ev
        cdef cnp.ndarray[cnp.float32_t, ndim=1] lg
        if n < 0:
            _raise(n, "step failed")
        out = []
        for i in range(n):
            ev = &self.events[i]
            if ev.type == CB_EVENT_TOKEN:
                d = {"type": "token", "id": ev.id, "token": ev.token, "logprob": ev.logprob,
                     "drafted": bool(ev.drafted)}
                if ev.n_top:
                    d["top"] = [(ev.top_tokens[j], ev.top_logprobs[j]) for j in range(ev.n_top)]
                if ev.logits != NULL:
                    lg = np.empty(self.n_vocab, dtype=np.float32)
                    memcpy(cnp.PyArray_DATA(lg), ev.logits, self.n_vocab * sizeof(float))
                    d["logits"] = lg
            elif ev.type == CB_EVENT_SCORE:
                d = _score_dict(ev, self.n_vocab)
            elif ev.type == CB_EVENT_DONE:
                d = {"type": "done", "id": ev.id, "metrics": _metrics_dict(&ev.metrics)}
                self._keep.pop(ev.id, None)
            else:
                d = {"type": "error", "id": ev.id, "status": ev.status,
                     "message": ev.message.decode("utf-8", "replace")}
                self._keep.pop(ev.id, None)
            out.append(d)
        return out

    def last_step(self):
        """Profile of the last step (cb_step_stats) as a dict."""
        self._check()
        cdef cb_step_stats s
        cb_engine_last_step(self.ptr, &s)
        return dict(step=s.step, rows_decode=s.rows_decode, rows_prefill=s.rows_prefill, n_running=s.n_running,
                    step_ms=s.step_ms, matmul_ms=s.matmul_ms, attention_ms=s.attention_ms,
                    lm_head_ms=s.lm_head_ms, sampling_ms=s.sampling_ms, grammar_ms=s.grammar_ms,
                    draft_ms=s.draft_ms, other_ms=s.other_ms, norm_ms=s.norm_ms, rope_ms=s.rope_ms,
                    sync_ms=s.sync_ms, experts_unique=s.experts_unique, experts_routed=s.experts_routed)

    def last_step_matmul_by_type(self):
        """Matmul time of the last step by weight type, {"q4_1": ms, ...} (LM head excluded)."""
        self._check()
        cdef cb_step_stats s
        cb_engine_last_step(self.ptr, &s)
        return {cb_type_name(t).decode(): s.matmul_type_ms[t] for t in range(32) if s.matmul_type_ms[t] > 0}

    def tokenize_bytes(self, data):
        """Token ids of raw bytes by the C byte-level BPE (no special tokens)."""
        self._check()
        cdef bytes b = bytes(data)
        cdef int cap = len(b) + 1
        cdef cnp.ndarray[cnp.int32_t, ndim=1] out = np.zeros(cap, dtype=np.int32)
        cdef int n = cb_engine_tokenize_bytes(self.ptr, b, len(b), <int32_t *>cnp.PyArray_DATA(out), cap)
        if n < 0:
            _raise(n, "the vocabulary is not byte-level BPE, or has no token for a byte of the input"
                   if n == CB_ERR_UNSUPPORTED else "tokenize failed")
        return out[:n].tolist()

    def spec_stats(self):
        """Per draft source: counts, acceptance by position and the adaptive policy's decision."""
        self._check()
        cdef cb_spec_stats st
        out = {}
        for name in SPEC_SOURCE_ORDER:
            cb_engine_spec_stats(self.ptr, SPEC_SOURCES[name], &st)
            n = max([i + 1 for i in range(CB_SPEC_MAX_K) if st.tried_pos[i]] or [0])
            out[name] = dict(drafts=st.drafts, draft_tokens=st.draft_tokens, accepted_tokens=st.accepted_tokens,
                             accept_rate=(st.accepted_tokens / st.draft_tokens) if st.draft_tokens else float("nan"),
                             tried_by_pos=[st.tried_pos[i] for i in range(n)],
                             accepted_by_pos=[st.accepted_pos[i] for i in range(n)],
                             # the policy's smoothed P(accept at i | accepted before), not a ratio of counts
                             policy_accept_rate_pos=[st.accept_rate_pos[i] for i in range(n)],
                             k=st.k, expected_gain=st.expected_gain, paused=bool(st.paused), draft_ms=st.draft_ms,
                             decisions=st.decisions, declined=st.declined, decline_rate=st.decline_rate)
        return out

    def slot_info(self, int slot):
        self._check()
        cdef int n_past = 0, busy = 0
        if cb_engine_slot_info(self.ptr, slot, &n_past, &busy) != CB_OK:
            raise errors.InvalidRequestError(f"slot {slot} is out of range")
        return {"n_past": n_past, "busy": bool(busy)}

    def slot_tokens(self, int slot):
        self._check()
        info = self.slot_info(slot)
        cdef cnp.ndarray[cnp.int32_t, ndim=1] out = np.zeros(max(1, info["n_past"]), dtype=np.int32)
        n = cb_engine_slot_tokens(self.ptr, slot, <int32_t *>cnp.PyArray_DATA(out), info["n_past"])
        return out[:n].tolist()

    def slot_clear(self, int slot):
        self._check()
        rc = cb_engine_slot_clear(self.ptr, slot)
        if rc != CB_OK:
            _raise(rc, f"cannot clear slot {slot}: {cb_status_str(rc).decode()}")

    def forward(self, int slot, tokens, int pos=0):
        """Raw forward of `tokens` at positions [pos, pos+n) on an idle slot; logits [n, n_vocab]."""
        self._check()
        cdef cnp.ndarray[cnp.int32_t, ndim=1] toks = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        cdef int n = toks.shape[0]
        if n == 0:
            raise errors.InvalidRequestError("forward needs at least one token")
        cdef cnp.ndarray[cnp.float32_t, ndim=2] out = np.empty((n, self.n_vocab), dtype=np.float32)
        cdef char err[ERR_LEN]
        cdef int rc
        cdef const int32_t *tp = <const int32_t *>cnp.PyArray_DATA(toks)
        cdef float *op = <float *>cnp.PyArray_DATA(out)
        err[0] = 0
        self.in_step = True
        try:
            with nogil:
                rc = cb_engine_forward(self.ptr, slot, tp, n, pos, op, err, ERR_LEN)
        finally:
            self.in_step = False
            if self.close_pending:
                self._free()
        if rc != CB_OK:
            _raise(rc, _err_str(err))
        return out

    def forward_argmax(self, int slot, tokens, int pos=0, skip=None):
        """Teacher-forced greedy tokens of `tokens` at [pos, pos+n) on an idle slot, with the layers in
        `skip` (indices) left out: int32 [n].  Layer-skip calibration; clear the slot before decoding on it."""
        self._check()
        cdef cnp.ndarray[cnp.int32_t, ndim=1] toks = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        cdef int n = toks.shape[0]
        if n == 0:
            raise errors.InvalidRequestError("forward needs at least one token")
        n_layer = self.model.info["n_layer"]
        cdef cnp.ndarray[cnp.uint8_t, ndim=1] mask = np.zeros(max(1, n_layer), dtype=np.uint8)
        for l in (skip or ()):
            if not 0 <= int(l) < n_layer:
                raise errors.InvalidRequestError(f"skip layer {l} is out of range [0, {n_layer})")
            mask[int(l)] = 1
        cdef cnp.ndarray[cnp.int32_t, ndim=1] out = np.empty(n, dtype=np.int32)
        cdef char err[ERR_LEN]
        cdef int rc
        cdef const int32_t *tp = <const int32_t *>cnp.PyArray_DATA(toks)
        cdef const uint8_t *mp = <const uint8_t *>cnp.PyArray_DATA(mask)
        cdef int32_t *op = <int32_t *>cnp.PyArray_DATA(out)
        err[0] = 0
        self.in_step = True
        try:
            with nogil:
                rc = cb_engine_forward_argmax(self.ptr, slot, tp, n, pos, mp, op, err, ERR_LEN)
        finally:
            self.in_step = False
            if self.close_pending:
                self._free()
        if rc != CB_OK:
            _raise(rc, _err_str(err))
        return out

    # ---- experts (MoE models)
    def expert_counts(self):
        """Rows routed to each (layer, expert) over the engine's life: int64 [n_layer, n_expert]
        (shape [n_layer, 0] for a dense model)."""
        self._check()
        info = self.model.info
        n_layer, n_expert = info["n_layer"], info["n_expert"]
        cdef cnp.ndarray[cnp.int64_t, ndim=1] out = np.zeros(max(1, n_layer * n_expert), dtype=np.int64)
        cdef int rc = cb_engine_expert_counts(self.ptr, <int64_t *>cnp.PyArray_DATA(out), n_layer * n_expert)
        if rc < 0:
            _raise(rc, "expert_counts failed")
        return out[:n_layer * n_expert].reshape(n_layer, n_expert)

    def route_trace(self, path):
        """Append every routing decision (step,forward,row,slot,pos,layer,rank,expert,weight) to a CSV
        file at `path`; None stops tracing."""
        self._check()
        cdef bytes bp = (str(path) if path is not None else "").encode()
        cdef char err[ERR_LEN]
        err[0] = 0
        cdef int rc = cb_engine_route_trace(self.ptr, bp, err, ERR_LEN)
        if rc != CB_OK:
            _raise(rc, _err_str(err))
