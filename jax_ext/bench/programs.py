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

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import jax
import jax.numpy as jnp
from jax import lax

import jax_ext

from .kinds import ELEMENTWISE, SPARSE
from .records import Case, JaxFn, Made

Array = jax.Array
Select = Callable[..., Array]  # jax_ext.where (where3) or jnp.where, the same arguments
Gather = Callable[[Array, Array], Array]  # _gather or _take
# numpy arrays (or scalars) from a seeded generator, made into jax arrays by the case
MakeArgs = Callable[[np.random.Generator], tuple[npt.ArrayLike, ...]]


class _Prog(NamedTuple):
    """A program written twice, ours and theirs, and how to make its arguments."""
    name: str
    ours: JaxFn
    theirs: JaxFn
    make_args: MakeArgs
    dtype: str = "float32"


def _case(p: _Prog, kind: str) -> Case:
    def make() -> Made:
        args = p.make_args(np.random.default_rng(0))
        return jax.jit(p.ours), jax.jit(p.theirs), tuple(jnp.asarray(a) for a in args)
    return Case(name=p.name, op="program", dtype=p.dtype, elements=0, bytes=0,
                make=make, chain=False, exact=False, impls=True, kind=kind)


def _vec(n: int, dtype: npt.DTypeLike = np.float32) -> MakeArgs:
    return lambda rng: (rng.standard_normal(n).astype(np.float32).astype(dtype),
                        rng.standard_normal(n).astype(np.float32).astype(dtype))


# --- element-wise programs: a select among the element-wise ops around it --------------

def _where_chain(k: int) -> _Prog:
    """where(x > 0, x * 2, y + 1) on 2^k float32: one select among the ops it fuses with."""
    return _Prog(f"prog where(x>0, x*2, y+1) f32 2^{k}",
                 lambda x, y: jax_ext.where(x > 0, x * 2, y + 1),
                 lambda x, y: jnp.where(x > 0, x * 2, y + 1), _vec(1 << k))


def _where_chains(quick: bool) -> list[_Prog]:
    big = 1 << (20 if quick else 22)
    tag = "2^20" if quick else "2^22"
    W = jax_ext.where
    out = [_where_chain(k) for k in ([20] if quick else [20, 22])]
    out.append(_Prog(f"prog sum(where(x>0, x, y)) f32 {tag}",
                     lambda x, y: jnp.sum(W(x > 0, x, y)),
                     lambda x, y: jnp.sum(jnp.where(x > 0, x, y)), _vec(big)))

    def g(w: Select) -> JaxFn:
        return jax.grad(lambda x, y: jnp.sum(w(x > 0, x * x, y)), argnums=(0, 1))
    out.append(_Prog(f"prog grad sum(where(x>0, x*x, y)) f32 {tag}", g(W), g(jnp.where),
                     _vec(big)))
    import ml_dtypes
    out.append(_Prog(f"prog where(x>0, x*2, y+1) bf16 {tag}",
                     lambda x, y: W(x > 0, x * 2, y + 1),
                     lambda x, y: jnp.where(x > 0, x * 2, y + 1), _vec(big, ml_dtypes.bfloat16),
                     dtype="bfloat16"))
    return out


def _clip(quick: bool) -> _Prog:
    big = 1 << (20 if quick else 22)
    tag = "2^20" if quick else "2^22"

    def clip(w: Select) -> JaxFn:
        return lambda g, t: w(jnp.abs(g) > t, jnp.sign(g) * t, g)
    return _Prog(f"prog clip where(|g|>t, sign(g)*t, g) f32 {tag}", clip(jax_ext.where),
                 clip(jnp.where),
                 lambda rng: (rng.standard_normal(big).astype(np.float32), np.float32(1.0)))


def _safe_log_likelihood() -> _Prog:
    def nll(w: Select) -> JaxFn:  # the double-where trick that keeps log's gradient finite
        def f(x: Array) -> Array:
            safe = w(x > 0, x, 1.0)
            return -jnp.sum(w(x > 0, jnp.log(safe), 0.0))
        return jax.grad(f)
    n20 = 1 << 20
    return _Prog("prog grad NaN-safe log-likelihood f32 2^20", nll(jax_ext.where),
                 nll(jnp.where), lambda rng: (rng.standard_normal(n20).astype(np.float32),))


def _attention(quick: bool) -> list[_Prog]:
    B, S, D = (4, 256, 64) if quick else (8, 512, 64)
    W = jax_ext.where

    def attn(w: Select, causal: bool) -> JaxFn:
        def f(q: Array, k: Array, v: Array, pad: Array) -> Array:
            s = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(D).astype(np.float32)
            if causal:
                mask = lax.broadcasted_iota(jnp.int32, (S, S), 0) >= \
                    lax.broadcasted_iota(jnp.int32, (S, S), 1)
            else:
                mask = pad[:, None, :]  # (B, 1, S): keys that are real tokens
            s = w(mask, s, jnp.float32(-1e30))
            return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        q, k, v = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(3))
        lens = rng.integers(S // 2, S + 1, B)
        return q, k, v, np.arange(S)[None, :] < lens[:, None]

    out: list[_Prog] = []
    for causal, tag in ((True, "causal mask (iota)"), (False, "padding mask (argument)")):
        out.append(_Prog(f"prog attention fwd {tag} {B}x{S}x{D}", attn(W, causal),
                         attn(jnp.where, causal), args))

        def bwd(w: Select, causal: bool = causal) -> JaxFn:
            f = attn(w, causal)
            return jax.grad(lambda q, k, v, pad: jnp.sum(f(q, k, v, pad) ** 2), argnums=(0, 1, 2))
        out.append(_Prog(f"prog attention grad {tag} {B}x{S}x{D}", bwd(W), bwd(jnp.where), args))
    return out


def _scan_rnn(quick: bool) -> _Prog:
    T, B, H = (32, 64, 256) if quick else (64, 128, 512)

    def rnn(w3: Select) -> JaxFn:
        def f(xs: Array, alive: Array, wx: Array, wh: Array) -> Array:
            def step(h: Array, inp: tuple[Array, Array]) -> tuple[Array, None]:
                x, a = inp
                h_new = jnp.tanh(x @ wx + h @ wh)
                return w3(a, h_new, h), None  # finished sequences keep their state
            h, _ = lax.scan(step, jnp.zeros((B, H), xs.dtype), (xs, alive))
            return h
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        lens = rng.integers(1, T + 1, B)
        return (rng.standard_normal((T, B, H)).astype(np.float32),
                np.arange(T)[:, None] < lens[None, :],
                rng.standard_normal((H, H)).astype(np.float32) / np.sqrt(H),
                rng.standard_normal((H, H)).astype(np.float32) / np.sqrt(H))

    def jnp_rows(a: Array, x: Array, y: Array) -> Array:
        return jnp.where(a[:, None], x, y)
    return _Prog(f"prog scan RNN where3 rows T={T} B={B} H={H}", rnn(jax_ext.where3),
                 rnn(jnp_rows), args)


def _masked_pooling(quick: bool) -> _Prog:
    """Masked mean pooling, the mask an argument."""
    B, S, H = (16, 256, 128) if quick else (64, 512, 256)

    def pool(w: Select) -> JaxFn:
        def f(h: Array, mask: Array) -> Array:
            count = jnp.maximum(mask.sum(1, keepdims=True), 1).astype(h.dtype)
            return w(mask[..., None], h, 0.0).sum(1) / count
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        lens = rng.integers(1, S + 1, B)
        return (rng.standard_normal((B, S, H)).astype(np.float32),
                np.arange(S)[None, :] < lens[:, None])
    return _Prog(f"prog masked mean pooling {B}x{S}x{H}", pool(jax_ext.where),
                 pool(jnp.where), args)


def elementwise(quick: bool, full: bool = True) -> list[Case]:
    """The element-wise programs: every one (`full`), or the default run's three: a select
    among the ops it fuses with, an attention mask made inside the program (the causal
    forward pass) and one that `auto` runs natively (masked mean pooling)."""
    if full:
        programs = [*_where_chains(quick), _clip(quick), _safe_log_likelihood(),
                    *_attention(quick), _scan_rnn(quick), _masked_pooling(quick)]
    else:
        programs = [_where_chain(20 if quick else 22), _attention(quick)[0],
                    _masked_pooling(quick)]
    return [_case(p, ELEMENTWISE) for p in programs]


# --- sparse programs: row gathers (and their gradients, scatter-adds) among other ops ---

def _take(table: Array, idx: Array) -> Array:
    return jnp.take(table, idx, axis=0, mode="fill", fill_value=0)


def _gather(table: Array, idx: Array) -> Array:
    return jax_ext.gather(table, [0], 0, idx, align_bytes=None)


def _vocab(quick: bool) -> tuple[int, int, int]:
    """(rows, columns, lookups) of the embedding tables of the first sparse programs."""
    return (20000, 128, 4096) if quick else (50000, 128, 8192)


def _gather_reductions(quick: bool) -> list[_Prog]:
    V, D, N = _vocab(quick)

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((V, D)).astype(np.float32),
                rng.integers(0, V, N).astype(np.int32))

    def tanh_sum(g: Gather) -> JaxFn:
        return lambda t, i: jnp.tanh(g(t, i)).sum(-1)
    return [_Prog(f"prog tanh(gather(table, idx)).sum(-1) {V}x{D} n={N}",
                  tanh_sum(_gather), tanh_sum(_take), args),
            _Prog(f"prog grad tanh(gather).sum {V}x{D} n={N}",
                  jax.grad(lambda t, i: tanh_sum(_gather)(t, i).sum()),
                  jax.grad(lambda t, i: tanh_sum(_take)(t, i).sum()), args)]


def _embedding_bag(quick: bool) -> _Prog:
    """Mean of `bag` rows per example, a dense layer, softmax cross-entropy; one SGD step
    on the table and the layer."""
    V, D, _ = _vocab(quick)
    B, bag, C = (256, 16, 64) if quick else (512, 32, 128)

    def step(g: Gather) -> JaxFn:
        def loss(params: tuple[Array, Array], ids: Array, labels: Array) -> Array:
            table, w = params
            e = g(table, ids.reshape(-1)).reshape(B, bag, D).mean(axis=1)
            logits = e @ w
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

        def f(table: Array, w: Array, ids: Array, labels: Array) -> tuple[Array, Array]:
            gt, gw = jax.grad(loss)((table, w), ids, labels)
            return table - 0.1 * gt, w - 0.1 * gw
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((V, D)).astype(np.float32) * 0.1,
                rng.standard_normal((D, C)).astype(np.float32) * 0.1,
                rng.integers(0, V, (B, bag)).astype(np.int32),
                rng.integers(0, C, B).astype(np.int32))
    return _Prog(f"prog embedding-bag SGD step {V}x{D} B={B} bag={bag}", step(_gather),
                 step(_take), args)


def _topk_dispatch(quick: bool) -> _Prog:
    """Mixture-of-experts routing: each token gathers the rows of its k best experts and
    mixes them by their gates."""
    T, E, K, H = (1024, 64, 2, 256) if quick else (4096, 64, 4, 512)

    def moe(g: Gather) -> JaxFn:
        def f(x: Array, router: Array, experts: Array) -> Array:
            gates, idx = lax.top_k(jax.nn.softmax(x @ router), K)  # (T, K)
            rows = g(experts, idx.reshape(-1)).reshape(T, K, H)
            return jnp.einsum("tk,tkh->th", gates, rows)
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((T, H)).astype(np.float32),
                rng.standard_normal((H, E)).astype(np.float32),
                rng.standard_normal((E, H)).astype(np.float32))
    return _Prog(f"prog top-{K} dispatch T={T} E={E} H={H}", moe(_gather), moe(_take), args)


def _dlrm(quick: bool) -> _Prog:
    """One lookup in each of T tables, concat, dense, tanh, loss; the gradient w.r.t. the
    tables (a scatter-add into each whole table) and the weights."""
    T, V, D, B = (4, 50000, 32, 2048) if quick else (4, 250000, 32, 8192)

    def dlrm(g: Gather) -> JaxFn:
        def loss(*a: Array) -> Array:  # T tables, w, ids, y
            tables, (w, ids, y) = a[:T], a[T:]
            e = jnp.concatenate([g(t, ids[:, k]) for k, t in enumerate(tables)], axis=1)
            return jnp.mean((jnp.tanh(e @ w)[:, 0] - y) ** 2)
        return jax.grad(loss, argnums=tuple(range(T + 1)))

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (*(rng.standard_normal((V, D)).astype(np.float32) * 0.1 for _ in range(T)),
                rng.standard_normal((T * D, 1)).astype(np.float32) * 0.1,
                rng.integers(0, V, (B, T)).astype(np.int32),
                rng.standard_normal(B).astype(np.float32))
    return _Prog(f"prog DLRM-like grad {T} tables {V}x{D} B={B}", dlrm(_gather), dlrm(_take),
                 args)


def _gnn(quick: bool) -> _Prog:
    """Message passing with its gradient: gather source nodes' features per edge, weight,
    sum into destination nodes, a dense layer; grad w.r.t. features and weights."""
    N, E, F = (10000, 80000, 32) if quick else (50000, 400000, 64)

    def gnn(g: Gather) -> JaxFn:
        def loss(h: Array, w: Array, src: Array, dst: Array, ew: Array) -> Array:
            msg = g(h, src) * ew[:, None]
            agg = jax.ops.segment_sum(msg, dst, num_segments=N)
            return jnp.sum(jnp.tanh(agg @ w) ** 2)
        return jax.grad(loss, argnums=(0, 1))

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((N, F)).astype(np.float32),
                rng.standard_normal((F, F)).astype(np.float32) / np.sqrt(F),
                rng.integers(0, N, E).astype(np.int32), rng.integers(0, N, E).astype(np.int32),
                rng.random(E).astype(np.float32))
    return _Prog(f"prog GNN message passing grad N={N} E={E} F={F}", gnn(_gather), gnn(_take),
                 args)


def _paged_kv(quick: bool) -> _Prog:
    """KV-cache decode: gather each sequence's blocks by its block table, attention."""
    Sq, NB, BS, Hd = (8, 16, 16, 128) if quick else (32, 32, 16, 128)
    pool_blocks = 2 * Sq * NB

    def paged(g: Gather) -> JaxFn:
        def f(q: Array, kpool: Array, vpool: Array, table: Array) -> Array:
            flat = table.reshape(-1)
            k = g(kpool, flat).reshape(Sq, NB * BS, Hd)
            v = g(vpool, flat).reshape(Sq, NB * BS, Hd)
            p = jax.nn.softmax(jnp.einsum("sd,skd->sk", q, k) / np.sqrt(Hd).astype(np.float32))
            return jnp.einsum("sk,skd->sd", p, v)
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((Sq, Hd)).astype(np.float32),
                rng.standard_normal((pool_blocks, BS, Hd)).astype(np.float32),
                rng.standard_normal((pool_blocks, BS, Hd)).astype(np.float32),
                rng.permutation(pool_blocks)[:Sq * NB].reshape(Sq, NB).astype(np.int32))
    return _Prog(f"prog paged KV-cache decode {Sq}x{NB} blocks of {BS}x{Hd}", paged(_gather),
                 paged(_take), args)


def _vmap_gather(quick: bool) -> _Prog:
    """vmap of a gather over an argument table (jax_ext's batching rule adds a size-1
    batch dim to the table)."""
    V, D, nb, ni = (50000, 64, 8, 2048) if quick else (200000, 64, 16, 4096)

    def vgather(g: Gather) -> JaxFn:
        return lambda t, i: jax.vmap(lambda i: g(t, i))(i)

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((V, D)).astype(np.float32),
                rng.integers(0, V, (nb, ni)).astype(np.int32))
    return _Prog(f"prog vmap gather over an argument table {V}x{D} {nb}x{ni}",
                 vgather(_gather), vgather(_take), args)


def _retrieval(quick: bool) -> _Prog:
    """Rescore each query's candidate ids against a corpus of embeddings, keep the best
    (candidate generation's second stage)."""
    C, D, Bq, K = (100000, 64, 64, 256) if quick else (1000000, 64, 256, 512)

    def rescore(g: Gather) -> JaxFn:
        def f(corpus: Array, q: Array, cand: Array) -> Array:
            e = g(corpus, cand.reshape(-1)).reshape(Bq, K, D)
            scores = jnp.einsum("bd,bkd->bk", q, e)
            return lax.top_k(scores, 8)[0]
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((C, D)).astype(np.float32),
                rng.standard_normal((Bq, D)).astype(np.float32),
                rng.integers(0, C, (Bq, K)).astype(np.int32))
    return _Prog(f"prog retrieval rescoring corpus {C}x{D} {Bq}x{K} candidates",
                 rescore(_gather), rescore(_take), args)


def _graphsage(quick: bool) -> _Prog:
    """GraphSAGE-style sampled-neighbor mean (missing neighbors masked out with a select)
    and its gradient w.r.t. the features (a scatter-add)."""
    N, F, Bn, fan = (20000, 64, 1024, 16) if quick else (100000, 128, 4096, 25)

    def sage(g: Gather, w: Select) -> JaxFn:
        def loss(h: Array, nbr: Array, ok: Array) -> Array:
            x = g(h, nbr.reshape(-1)).reshape(Bn, fan, F)
            x = w(ok[..., None], x, 0.0).sum(1) / jnp.maximum(ok.sum(1, keepdims=True), 1)
            return jnp.sum(jnp.tanh(x) ** 2)
        return jax.grad(loss)

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((N, F)).astype(np.float32),
                rng.integers(0, N, (Bn, fan)).astype(np.int32), rng.random((Bn, fan)) < 0.8)
    return _Prog(f"prog GraphSAGE neighbor mean grad N={N} F={F} {Bn}x{fan}",
                 sage(_gather, jax_ext.where), sage(_take, jnp.where), args)


def _beam_search(quick: bool) -> _Prog:
    """One decoding step of beam search: reorder the KV cache rows by each beam's parent
    and mask finished beams' logits."""
    Bb, L, Hc, Vo = (32, 256, 256, 8192) if quick else (64, 512, 512, 32000)

    def beam(g: Gather, w: Select) -> JaxFn:
        def f(cache: Array, parents: Array, finished: Array,
              logits: Array) -> tuple[Array, Array]:
            flat = cache.reshape(Bb, L * Hc)
            cache = g(flat, parents).reshape(Bb, L, Hc)
            logits = w(finished[:, None], jnp.float32(-1e9), logits)
            return cache, jnp.argmax(logits, -1)
        return f

    def args(rng: np.random.Generator) -> tuple[npt.NDArray[Any], ...]:
        return (rng.standard_normal((Bb, L, Hc)).astype(np.float32),
                rng.integers(0, Bb, Bb).astype(np.int32), rng.random(Bb) < 0.25,
                rng.standard_normal((Bb, Vo)).astype(np.float32))
    return _Prog(f"prog beam-search cache reorder {Bb}x{L}x{Hc} vocab {Vo}",
                 beam(_gather, jax_ext.where), beam(_take, jnp.where), args)


def sparse(quick: bool, full: bool = True) -> list[Case]:
    """The sparse programs: every one (`full`), or the default run's two: a gather's
    gradient (a scatter-add) among other ops, and a paged KV-cache decode."""
    if full:
        programs = [*_gather_reductions(quick), _embedding_bag(quick), _topk_dispatch(quick),
                    _dlrm(quick), _gnn(quick), _paged_kv(quick), _vmap_gather(quick),
                    _retrieval(quick), _graphsage(quick), _beam_search(quick)]
    else:
        programs = [_gather_reductions(quick)[1], _paged_kv(quick)]
    return [_case(p, SPARSE) for p in programs]


def cases(quick: bool, full: bool = True) -> list[Case]:
    """Every program (`full`), or the default run's selection of them."""
    return elementwise(quick, full) + sparse(quick, full)
