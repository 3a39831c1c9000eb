"""Whole jitted programs for the benchmark: each written twice, identical but for the
jax_ext call (ours) vs jnp.where / jnp.take (theirs), so the ratio shows what a user's
program feels -- the op among the ops around it -- not a standalone call.

Each case is a dict like the standalone ones (select.py); ``exact`` is False because XLA
may round the ops around the select/gather differently once their fusions differ, so the
two programs are compared with a tolerance there. Two kinds (kinds.py): element-wise
programs, whose jax_ext calls are selects, and sparse programs, built on row gathers
(whose gradients are scatter-adds).
"""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

import jax_ext

from .kinds import ELEMENTWISE, SPARSE


def _case(name, ours, theirs, make_args, *, dtype="float32"):
    def make():
        args = make_args(np.random.default_rng(0))
        return jax.jit(ours), jax.jit(theirs), tuple(jnp.asarray(a) for a in args)
    return dict(name=name, op="program", dtype=dtype, elements=0, bytes=0,
                make=make, chain=False, exact=False, impls=True)


def _vec(n, dtype=np.float32):
    return lambda rng: (rng.standard_normal(n).astype(np.float32).astype(dtype),
                        rng.standard_normal(n).astype(np.float32).astype(dtype))


# --- element-wise programs: a select among the element-wise ops around it --------------

def _where_chains(quick):
    big = 1 << (20 if quick else 22)
    tag = "2^20" if quick else "2^22"
    W = jax_ext.where
    out = []
    for k in ([20] if quick else [20, 22]):
        out.append(_case(f"prog where(x>0, x*2, y+1) f32 2^{k}",
                         lambda x, y: W(x > 0, x * 2, y + 1),
                         lambda x, y: jnp.where(x > 0, x * 2, y + 1), _vec(1 << k)))
    out.append(_case(f"prog sum(where(x>0, x, y)) f32 {tag}",
                     lambda x, y: jnp.sum(W(x > 0, x, y)),
                     lambda x, y: jnp.sum(jnp.where(x > 0, x, y)), _vec(big)))

    def g(w):
        return jax.grad(lambda x, y: jnp.sum(w(x > 0, x * x, y)), argnums=(0, 1))
    out.append(_case(f"prog grad sum(where(x>0, x*x, y)) f32 {tag}", g(W), g(jnp.where),
                     _vec(big)))
    import ml_dtypes
    out.append(_case(f"prog where(x>0, x*2, y+1) bf16 {tag}",
                     lambda x, y: W(x > 0, x * 2, y + 1),
                     lambda x, y: jnp.where(x > 0, x * 2, y + 1), _vec(big, ml_dtypes.bfloat16),
                     dtype="bfloat16"))
    return out


def _clip(quick):
    big = 1 << (20 if quick else 22)
    tag = "2^20" if quick else "2^22"

    def clip(w):
        return lambda g, t: w(jnp.abs(g) > t, jnp.sign(g) * t, g)
    return _case(f"prog clip where(|g|>t, sign(g)*t, g) f32 {tag}", clip(jax_ext.where),
                 clip(jnp.where),
                 lambda rng: (rng.standard_normal(big).astype(np.float32), np.float32(1.0)))


def _safe_log_likelihood():
    def nll(w):  # the double-where trick that keeps log's gradient finite
        def f(x):
            safe = w(x > 0, x, 1.0)
            return -jnp.sum(w(x > 0, jnp.log(safe), 0.0))
        return jax.grad(f)
    n20 = 1 << 20
    return _case("prog grad NaN-safe log-likelihood f32 2^20", nll(jax_ext.where),
                 nll(jnp.where), lambda rng: (rng.standard_normal(n20).astype(np.float32),))


def _attention(quick):
    B, S, D = (4, 256, 64) if quick else (8, 512, 64)
    W = jax_ext.where

    def attn(w, causal):
        def f(q, k, v, pad):
            s = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(D).astype(np.float32)
            if causal:
                mask = lax.broadcasted_iota(jnp.int32, (S, S), 0) >= \
                    lax.broadcasted_iota(jnp.int32, (S, S), 1)
            else:
                mask = pad[:, None, :]  # (B, 1, S): keys that are real tokens
            s = w(mask, s, jnp.float32(-1e30))
            return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)
        return f

    def args(rng):
        q, k, v = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(3))
        lens = rng.integers(S // 2, S + 1, B)
        return q, k, v, np.arange(S)[None, :] < lens[:, None]

    out = []
    for causal, tag in ((True, "causal mask (iota)"), (False, "padding mask (argument)")):
        out.append(_case(f"prog attention fwd {tag} {B}x{S}x{D}", attn(W, causal),
                         attn(jnp.where, causal), args))

        def bwd(w, causal=causal):
            f = attn(w, causal)
            return jax.grad(lambda q, k, v, pad: jnp.sum(f(q, k, v, pad) ** 2), argnums=(0, 1, 2))
        out.append(_case(f"prog attention grad {tag} {B}x{S}x{D}", bwd(W), bwd(jnp.where), args))
    return out


def _scan_rnn(quick):
    T, B, H = (32, 64, 256) if quick else (64, 128, 512)

    def rnn(w3):
        def f(xs, alive, wx, wh):
            def step(h, inp):
                x, a = inp
                h_new = jnp.tanh(x @ wx + h @ wh)
                return w3(a, h_new, h), None  # finished sequences keep their state
            h, _ = lax.scan(step, jnp.zeros((B, H), xs.dtype), (xs, alive))
            return h
        return f

    def args(rng):
        lens = rng.integers(1, T + 1, B)
        return (rng.standard_normal((T, B, H)).astype(np.float32),
                np.arange(T)[:, None] < lens[None, :],
                rng.standard_normal((H, H)).astype(np.float32) / np.sqrt(H),
                rng.standard_normal((H, H)).astype(np.float32) / np.sqrt(H))

    def jnp_rows(a, x, y):
        return jnp.where(a[:, None], x, y)
    return _case(f"prog scan RNN where3 rows T={T} B={B} H={H}", rnn(jax_ext.where3),
                 rnn(jnp_rows), args)


def _masked_pooling(quick):
    """Masked mean pooling, the mask an argument."""
    B, S, H = (16, 256, 128) if quick else (64, 512, 256)

    def pool(w):
        def f(h, mask):
            count = jnp.maximum(mask.sum(1, keepdims=True), 1).astype(h.dtype)
            return w(mask[..., None], h, 0.0).sum(1) / count
        return f

    def args(rng):
        lens = rng.integers(1, S + 1, B)
        return (rng.standard_normal((B, S, H)).astype(np.float32),
                np.arange(S)[None, :] < lens[:, None])
    return _case(f"prog masked mean pooling {B}x{S}x{H}", pool(jax_ext.where),
                 pool(jnp.where), args)


def elementwise(quick: bool) -> list[dict]:
    cases = [*_where_chains(quick), _clip(quick), _safe_log_likelihood(), *_attention(quick),
             _scan_rnn(quick), _masked_pooling(quick)]
    return [dict(c, kind=ELEMENTWISE) for c in cases]


# --- sparse programs: row gathers (and their gradients, scatter-adds) among other ops ---

def _take(table, idx):
    return jnp.take(table, idx, axis=0, mode="fill", fill_value=0)


def _gather(table, idx):
    return jax_ext.gather(table, [0], 0, idx, align_bytes=None)


def _vocab(quick):
    """(rows, columns, lookups) of the embedding tables of the first sparse programs."""
    return (20000, 128, 4096) if quick else (50000, 128, 8192)


def _gather_reductions(quick):
    V, D, N = _vocab(quick)

    def args(rng):
        return (rng.standard_normal((V, D)).astype(np.float32),
                rng.integers(0, V, N).astype(np.int32))

    def tanh_sum(g):
        return lambda t, i: jnp.tanh(g(t, i)).sum(-1)
    return [_case(f"prog tanh(gather(table, idx)).sum(-1) {V}x{D} n={N}",
                  tanh_sum(_gather), tanh_sum(_take), args),
            _case(f"prog grad tanh(gather).sum {V}x{D} n={N}",
                  jax.grad(lambda t, i: tanh_sum(_gather)(t, i).sum()),
                  jax.grad(lambda t, i: tanh_sum(_take)(t, i).sum()), args)]


def _embedding_bag(quick):
    """Mean of `bag` rows per example, a dense layer, softmax cross-entropy; one SGD step
    on the table and the layer."""
    V, D, _ = _vocab(quick)
    B, bag, C = (256, 16, 64) if quick else (512, 32, 128)

    def step(g):
        def loss(params, ids, labels):
            table, w = params
            e = g(table, ids.reshape(-1)).reshape(B, bag, D).mean(axis=1)
            logits = e @ w
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

        def f(table, w, ids, labels):
            gt, gw = jax.grad(loss)((table, w), ids, labels)
            return table - 0.1 * gt, w - 0.1 * gw
        return f

    def args(rng):
        return (rng.standard_normal((V, D)).astype(np.float32) * 0.1,
                rng.standard_normal((D, C)).astype(np.float32) * 0.1,
                rng.integers(0, V, (B, bag)).astype(np.int32),
                rng.integers(0, C, B).astype(np.int32))
    return _case(f"prog embedding-bag SGD step {V}x{D} B={B} bag={bag}", step(_gather),
                 step(_take), args)


def _topk_dispatch(quick):
    """Mixture-of-experts routing: each token gathers the rows of its k best experts and
    mixes them by their gates."""
    T, E, K, H = (1024, 64, 2, 256) if quick else (4096, 64, 4, 512)

    def moe(g):
        def f(x, router, experts):
            gates, idx = lax.top_k(jax.nn.softmax(x @ router), K)  # (T, K)
            rows = g(experts, idx.reshape(-1)).reshape(T, K, H)
            return jnp.einsum("tk,tkh->th", gates, rows)
        return f

    def args(rng):
        return (rng.standard_normal((T, H)).astype(np.float32),
                rng.standard_normal((H, E)).astype(np.float32),
                rng.standard_normal((E, H)).astype(np.float32))
    return _case(f"prog top-{K} dispatch T={T} E={E} H={H}", moe(_gather), moe(_take), args)


def _dlrm(quick):
    """One lookup in each of T tables, concat, dense, tanh, loss; the gradient w.r.t. the
    tables (a scatter-add into each whole table) and the weights."""
    T, V, D, B = (4, 50000, 32, 2048) if quick else (4, 250000, 32, 8192)

    def dlrm(g):
        def loss(*a):  # T tables, w, ids, y
            tables, (w, ids, y) = a[:T], a[T:]
            e = jnp.concatenate([g(t, ids[:, k]) for k, t in enumerate(tables)], axis=1)
            return jnp.mean((jnp.tanh(e @ w)[:, 0] - y) ** 2)
        return jax.grad(loss, argnums=tuple(range(T + 1)))

    def args(rng):
        return (*(rng.standard_normal((V, D)).astype(np.float32) * 0.1 for _ in range(T)),
                rng.standard_normal((T * D, 1)).astype(np.float32) * 0.1,
                rng.integers(0, V, (B, T)).astype(np.int32),
                rng.standard_normal(B).astype(np.float32))
    return _case(f"prog DLRM-like grad {T} tables {V}x{D} B={B}", dlrm(_gather), dlrm(_take),
                 args)


def _gnn(quick):
    """Message passing with its gradient: gather source nodes' features per edge, weight,
    sum into destination nodes, a dense layer; grad w.r.t. features and weights."""
    N, E, F = (10000, 80000, 32) if quick else (50000, 400000, 64)

    def gnn(g):
        def loss(h, w, src, dst, ew):
            msg = g(h, src) * ew[:, None]
            agg = jax.ops.segment_sum(msg, dst, num_segments=N)
            return jnp.sum(jnp.tanh(agg @ w) ** 2)
        return jax.grad(loss, argnums=(0, 1))

    def args(rng):
        return (rng.standard_normal((N, F)).astype(np.float32),
                rng.standard_normal((F, F)).astype(np.float32) / np.sqrt(F),
                rng.integers(0, N, E).astype(np.int32), rng.integers(0, N, E).astype(np.int32),
                rng.random(E).astype(np.float32))
    return _case(f"prog GNN message passing grad N={N} E={E} F={F}", gnn(_gather), gnn(_take),
                 args)


def _paged_kv(quick):
    """KV-cache decode: gather each sequence's blocks by its block table, attention."""
    Sq, NB, BS, Hd = (8, 16, 16, 128) if quick else (32, 32, 16, 128)
    pool_blocks = 2 * Sq * NB

    def paged(g):
        def f(q, kpool, vpool, table):
            flat = table.reshape(-1)
            k = g(kpool, flat).reshape(Sq, NB * BS, Hd)
            v = g(vpool, flat).reshape(Sq, NB * BS, Hd)
            p = jax.nn.softmax(jnp.einsum("sd,skd->sk", q, k) / np.sqrt(Hd).astype(np.float32))
            return jnp.einsum("sk,skd->sd", p, v)
        return f

    def args(rng):
        return (rng.standard_normal((Sq, Hd)).astype(np.float32),
                rng.standard_normal((pool_blocks, BS, Hd)).astype(np.float32),
                rng.standard_normal((pool_blocks, BS, Hd)).astype(np.float32),
                rng.permutation(pool_blocks)[:Sq * NB].reshape(Sq, NB).astype(np.int32))
    return _case(f"prog paged KV-cache decode {Sq}x{NB} blocks of {BS}x{Hd}", paged(_gather),
                 paged(_take), args)


def _vmap_gather(quick):
    """vmap of a gather over an argument table (jax_ext's batching rule adds a size-1
    batch dim to the table)."""
    V, D, nb, ni = (50000, 64, 8, 2048) if quick else (200000, 64, 16, 4096)

    def vgather(g):
        return lambda t, i: jax.vmap(lambda i: g(t, i))(i)

    def args(rng):
        return (rng.standard_normal((V, D)).astype(np.float32),
                rng.integers(0, V, (nb, ni)).astype(np.int32))
    return _case(f"prog vmap gather over an argument table {V}x{D} {nb}x{ni}",
                 vgather(_gather), vgather(_take), args)


def _retrieval(quick):
    """Rescore each query's candidate ids against a corpus of embeddings, keep the best
    (candidate generation's second stage)."""
    C, D, Bq, K = (100000, 64, 64, 256) if quick else (1000000, 64, 256, 512)

    def rescore(g):
        def f(corpus, q, cand):
            e = g(corpus, cand.reshape(-1)).reshape(Bq, K, D)
            scores = jnp.einsum("bd,bkd->bk", q, e)
            return lax.top_k(scores, 8)[0]
        return f

    def args(rng):
        return (rng.standard_normal((C, D)).astype(np.float32),
                rng.standard_normal((Bq, D)).astype(np.float32),
                rng.integers(0, C, (Bq, K)).astype(np.int32))
    return _case(f"prog retrieval rescoring corpus {C}x{D} {Bq}x{K} candidates",
                 rescore(_gather), rescore(_take), args)


def _graphsage(quick):
    """GraphSAGE-style sampled-neighbor mean (missing neighbors masked out with a select)
    and its gradient w.r.t. the features (a scatter-add)."""
    N, F, Bn, fan = (20000, 64, 1024, 16) if quick else (100000, 128, 4096, 25)

    def sage(g, w):
        def loss(h, nbr, ok):
            x = g(h, nbr.reshape(-1)).reshape(Bn, fan, F)
            x = w(ok[..., None], x, 0.0).sum(1) / jnp.maximum(ok.sum(1, keepdims=True), 1)
            return jnp.sum(jnp.tanh(x) ** 2)
        return jax.grad(loss)

    def args(rng):
        return (rng.standard_normal((N, F)).astype(np.float32),
                rng.integers(0, N, (Bn, fan)).astype(np.int32), rng.random((Bn, fan)) < 0.8)
    return _case(f"prog GraphSAGE neighbor mean grad N={N} F={F} {Bn}x{fan}",
                 sage(_gather, jax_ext.where), sage(_take, jnp.where), args)


def _beam_search(quick):
    """One decoding step of beam search: reorder the KV cache rows by each beam's parent
    and mask finished beams' logits."""
    Bb, L, Hc, Vo = (32, 256, 256, 8192) if quick else (64, 512, 512, 32000)

    def beam(g, w):
        def f(cache, parents, finished, logits):
            flat = cache.reshape(Bb, L * Hc)
            cache = g(flat, parents).reshape(Bb, L, Hc)
            logits = w(finished[:, None], jnp.float32(-1e9), logits)
            return cache, jnp.argmax(logits, -1)
        return f

    def args(rng):
        return (rng.standard_normal((Bb, L, Hc)).astype(np.float32),
                rng.integers(0, Bb, Bb).astype(np.int32), rng.random(Bb) < 0.25,
                rng.standard_normal((Bb, Vo)).astype(np.float32))
    return _case(f"prog beam-search cache reorder {Bb}x{L}x{Hc} vocab {Vo}",
                 beam(_gather, jax_ext.where), beam(_take, jnp.where), args)


def sparse(quick: bool) -> list[dict]:
    cases = [*_gather_reductions(quick), _embedding_bag(quick), _topk_dispatch(quick),
             _dlrm(quick), _gnn(quick), _paged_kv(quick), _vmap_gather(quick),
             _retrieval(quick), _graphsage(quick), _beam_search(quick)]
    return [dict(c, kind=SPARSE) for c in cases]


def cases(quick: bool) -> list[dict]:
    return elementwise(quick) + sparse(quick)
