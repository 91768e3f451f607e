/*
 * bpe.h — byte-level BPE tokenizer (GPT-2 family) in C, so that the engine can
 * tokenize grammar-forced byte spans (jump-forward) and speculative drafts
 * without calling back into Python.
 *
 * It reproduces the reference tokenizer (colibri_lab.tokenizer.Tokenizer, i.e.
 * HF `tokenizers` with llama.cpp's pre-tokenizer choice) for plain text:
 * no special-token parsing, no BOS/EOS.  Pipeline per call:
 *
 *   bytes -> pre-tokens (by tokenizer.ggml.pre: digit split and/or a
 *            hand-written matcher of the model's split regex, on UTF-8 code
 *            points; invalid UTF-8 bytes count as one "other" character each)
 *         -> each pre-token's bytes as single-byte tokens
 *         -> BPE merges, lowest rank first (leftmost on ties), until none applies.
 *
 * Supported tokenizer.ggml.pre values (the same groups as the Python side):
 *   smollm, starcoder, refact, codeshell, exaone, minerva-7b   digits, then GPT-2 regex
 *   gpt-2, phi-2, jina-*, gigachat, roberta-bpe                 GPT-2 regex
 *   llama3, llama-v3, llama-bpe, falcon3, pixtral               llama3 regex + ignore_merges
 *   qwen2, deepseek-r1-qwen, megrez                             qwen2 regex
 * Anything else (including "default") is CB_ERR_UNSUPPORTED.
 *
 * A cb_bpe is immutable after build and owns copies of everything it needs
 * (it may outlive the model); any number of threads may tokenize with it at
 * once, each with its own scratch.
 */
#ifndef CB_BPE_H
#define CB_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

typedef struct cb_bpe cb_bpe;

/* Build from a loaded model's tokenizer.ggml.{model,tokens,merges,pre}.
 * CB_ERR_UNSUPPORTED if the vocabulary is not gpt2 byte-level BPE (a printable
 * ASCII byte has no single-byte token), or the pre-tokenizer type is unknown; CB_ERR_FORMAT for
 * malformed arrays.  On failure *out is NULL. */
int  cb_bpe_build(const cb_model *model, cb_bpe **out, char *err, size_t err_len);

/* Build from plain arrays (tests, tools): tokens[i] is token i's text as a
 * GGUF stores it (byte-level form, e.g. "Ġthe"), tok_len[i] its byte length;
 * merges[k] is "left right" of rank k.  `pre` is a tokenizer.ggml.pre value. */
int  cb_bpe_build_arrays(const char *const *tokens, const size_t *tok_len, int n_tokens,
                         const char *const *merges, const size_t *merge_len, int n_merges,
                         const char *pre, cb_bpe **out, char *err, size_t err_len);

void cb_bpe_free(cb_bpe *bpe);  /* NULL is fine */

/* Bytes of scratch cb_bpe_tokenize needs for an input of n bytes
 * (SIZE_MAX if n is too large to tokenize in one call). */
size_t cb_bpe_scratch_size(size_t n);

/* Tokenize bytes[0..n) as the reference tokenizer tokenizes that text.  Writes
 * the first min(count, cap) ids to out and returns count, the number of ids the
 * whole input takes (count > cap: call again with more room); or a negative
 * cb_status:
 *   CB_ERR_ARG          NULL pointers, cap < 0, n > 2^30, or scratch smaller
 *                       than cb_bpe_scratch_size(n);
 *   CB_ERR_UNSUPPORTED  the input holds a byte the vocabulary has no token for
 *                       (cb_bpe_byte_token() < 0; SmolLM2 lacks 21 such bytes,
 *                       e.g. 0x04 and the never-valid UTF-8 bytes 0xC0, 0xF5..):
 *                       no id sequence can reproduce it; the reference would
 *                       silently drop it.
 * Allocation-free.  On success the ids' bytes (cb_model_token_bytes)
 * concatenate back to the input exactly. */
int  cb_bpe_tokenize(const cb_bpe *bpe, const uint8_t *bytes, size_t n, int32_t *out, int cap,
                     void *scratch, size_t scratch_size);

/* cb_bpe_tokenize, and *n_stable (if not NULL): how many leading ids stay the
 * same whatever bytes are appended to the input — all but those of the last
 * pre-token (for llama3/qwen2 sometimes the last two: "\n" then "  ").  A
 * grammar-forced draft should keep only those: the rest may tokenize
 * differently once the text goes on (" wor" -> " w","or" but " world" is one). */
int  cb_bpe_tokenize_ex(const cb_bpe *bpe, const uint8_t *bytes, size_t n, int32_t *out, int cap,
                        void *scratch, size_t scratch_size, int *n_stable);

/* Test/binding convenience: cb_bpe_tokenize with scratch malloc'd and freed
 * inside (CB_ERR_NOMEM if that fails).  Not for hot paths. */
int  cb_bpe_tokenize_alloc(const cb_bpe *bpe, const uint8_t *bytes, size_t n, int32_t *out, int cap);

/* Id of the single-byte token for `byte`, or -1 if the vocabulary has none. */
int  cb_bpe_byte_token(const cb_bpe *bpe, uint8_t byte);

/* Number of tokens in the vocabulary the tokenizer was built from. */
int  cb_bpe_n_vocab(const cb_bpe *bpe);

#endif
