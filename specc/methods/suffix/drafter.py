"""Suffix decoding: draft from suffix trees over the request's own tokens, over earlier requests'
outputs, and over documents (corpora), with no model forward.

Facts (Oliaro et al., "SuffixDecoding", arXiv:2411.04975; Arctic Inference's ``SuffixDecodingCache``
and ``SuffixTree``; vLLM ``method: suffix``, keys ``suffix_decoding_max_tree_depth`` 24,
``..._max_cached_requests`` 10000, ``..._max_spec_factor`` 1.0, ``..._min_token_prob`` 0.1 with the
bounds of vllm/config/speculative.py:1741-1760):

* Each request has a **local** suffix tree over its prompt and output, extended as tokens are
  accepted (never rebuilt). A **global** tree holds earlier requests' outputs (FIFO-evicted past
  ``max_cached_requests``; 0 disables it) and the plan's corpora and documents added at run time
  (pinned, bounded by ``max_corpus_tokens``; REST, He et al. 2023, drafts from such a datastore).
* A tree is a trie of every suffix of every sequence, cut at ``max_tree_depth`` tokens; a node's
  **count** is the number of suffixes (start positions) passing through or ending at it, so
  ``count(child) / count(node)`` is the empirical frequency of the child after the node's string.
* To draft, the last m tokens of the request (m = 1 .. depth - 1) are matched; from the matched node
  the most frequent continuation is followed while its path probability (product of frequencies)
  stays >= ``min_token_prob``, for at most ``floor(m * max_spec_factor)`` tokens. The draft with the
  highest score (sum of path probabilities: the expected accepted length if the frequencies were the
  acceptance rates) wins, over every m and over the local and global trees (ties: the longer match,
  the local tree).
* With ``topk > 1`` the draft is a **tree**: nodes are taken best-first by path probability (a heap),
  up to ``num_draft_tokens - 1`` nodes, ``topk`` children per node, ``num_steps`` levels.

Two departures from the reference, both on the side of better estimates: the request's own output
enters the global tree when the request finishes (so the global tree never holds the unfinished tail
a request is matching), and the local tree's matched node discounts that tail itself (it ends at the
matched node and has no continuation; the reference counts it, halving a unique continuation's
frequency).

Memory: leaves are path-compressed (a suffix seen once is one node that points into its sequence,
split when a second suffix follows it), so a tree holds O(total tokens + repeated substrings) nodes.

Confidence (the ``budget`` schedule's survival): the empirical frequencies, calibrated online by the
verify outcomes of earlier drafts of the same kind (:class:`FrequencyCalibration`; without outcomes,
the frequencies themselves). Drafts are one-hot (q = δ), a deterministic function of the history, so
greedy and standard verification stay exact.
Everything here runs on the host, under one lock shared with :meth:`SuffixDrafter.add_document`
(called from a server thread).
"""
from __future__ import annotations

import heapq
import threading
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from specc.methods.suffix.corpus import CorpusTooLarge
from specc.methods.base import (BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, TreeRequest, VerifyStep,
                                 host_batch, host_verify)
from specc.errors import PlanError

#: vLLM 0.33.0's defaults (SpeculativeConfig, vllm/config/speculative.py:538-553).
DEFAULTS = {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0, "min_token_prob": 0.1}
#: Tokens the global tree takes from corpora and added documents together, when the plan leaves
#: ``method.suffix.max_corpus_tokens`` unset (a tree holds about 200 bytes per token of text).
DEFAULT_MAX_CORPUS_TOKENS = 1 << 18
#: Tokens inserted per hold of the lock when a document is added (decoding steps run in between).
INSERT_CHUNK = 2048


# ----------------------------------------------------------------------------------------- the tree
class _Node:
    """One trie node. Explicit: ``kids`` maps token -> child. Leaf (``kids is None``): the tokens of
    one suffix from ``seq[idx]`` on (its owner's sequence, read lazily), count 1 at every position.
    ``depth``: the depth of the node's (first) token; ``best``: the child of highest count, cached."""

    __slots__ = ("count", "kids", "seq", "idx", "depth", "best")

    def __init__(self, count: int, depth: int, seq: Optional[array] = None, idx: int = 0) -> None:
        self.count = count
        self.depth = depth
        self.seq = seq
        self.idx = idx
        self.kids: Optional[Dict[int, "_Node"]] = None if seq is not None else {}
        self.best: Optional[int] = None


class SuffixTree:
    """Every suffix of a set of token sequences, each cut at ``max_depth`` tokens, with counts.

    Sequences grow by :meth:`extend` (O(max_depth) per token: the suffixes still shorter than
    ``max_depth`` step one level) and leave by :meth:`remove`. Matching and drafting read it.

    Args:
        max_depth: ``method.suffix.max_tree_depth`` (>= 1).
    """

    def __init__(self, max_depth: int) -> None:
        if int(max_depth) < 1:
            raise PlanError(f"method.suffix.max_tree_depth must be >= 1, got {max_depth}")
        self.max_depth = int(max_depth)
        self.root = _Node(0, 0)
        self.seqs: Dict[int, array] = {}
        self._open: Dict[int, List[List[Any]]] = {}  # seq id -> [[start, node], ...] suffixes still growing

    @property
    def num_tokens(self) -> int:
        """Tokens held (the root's count: one suffix per token)."""
        return self.root.count

    def extend(self, sid: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``sid`` (created when new)."""
        seq = self.seqs.get(sid)
        if seq is None:
            seq = self.seqs[sid] = array("l")
            self._open[sid] = []
        opened = self._open[sid]
        for t in tokens:
            self._append(seq, opened, int(t))

    def close(self, sid: int) -> None:
        """Sequence ``sid`` will not grow: drop its bookkeeping of growing suffixes."""
        self._open.pop(sid, None)

    def _append(self, seq: array, opened: List[List[Any]], token: int) -> None:
        end = len(seq)  # index of the new token
        seq.append(token)
        self.root.count += 1
        opened.append([end, self.root])
        depth_cap = self.max_depth
        keep = []
        for entry in opened:
            start, node = entry
            length = end - start  # the suffix's length before this token
            while node.kids is not None and node.depth < length:  # a leaf it sat in was split since
                node = node.kids[seq[start + node.depth]]
            if node.kids is None:  # inside its own leaf: it grows with the sequence
                if length + 1 < depth_cap:
                    entry[1] = node
                    keep.append(entry)
                continue
            child = node.kids.get(token)
            if child is None:
                child = _Node(1, length + 1, seq, end)
                node.kids[token] = child
            else:
                if child.kids is None:
                    self._split(child)
                child.count += 1
            b = node.best
            if (b is None and len(node.kids) == 1) or (b is not None and b != token
                                                         and child.count > node.kids[b].count):
                node.best = token  # (None with several children: recomputed when read)
            if length + 1 < depth_cap:
                entry[1] = child
                keep.append(entry)
        opened[:] = keep

    def _split(self, leaf: _Node) -> None:
        """Make a leaf explicit: its first token becomes a node of its own, the rest of its owner's
        suffix a new leaf below it (when the owner reaches that far)."""
        seq, j, d = leaf.seq, leaf.idx, leaf.depth
        leaf.kids, leaf.seq, leaf.best = {}, None, None
        if j + 1 < len(seq) and d < self.max_depth:
            t = seq[j + 1]
            leaf.kids[t] = _Node(1, d + 1, seq, j + 1)
            leaf.best = t

    def remove(self, sid: int) -> None:
        """Take sequence ``sid`` out: every suffix's path loses one count; nodes left at 0 go."""
        seq = self.seqs.pop(sid, None)
        self._open.pop(sid, None)
        if seq is None:
            return
        n = len(seq)
        self.root.count -= n
        for start in range(n):
            node = self.root
            for i in range(start, min(n, start + self.max_depth)):
                t = seq[i]
                child = node.kids[t]
                if child.kids is None or child.count == 1:  # this suffix's own leaf (or last count)
                    del node.kids[t]
                    if node.best == t:
                        node.best = None
                    break
                child.count -= 1
                if node.best == t:
                    node.best = None  # recomputed lazily
                node = child

    # ------------------------------------------------------------------ reading
    def locate(self, pattern: Sequence[int]):
        """The position of ``pattern`` in the tree: ``(node, i)``, ``i`` None at an explicit node, else
        the index in the leaf's sequence of the last matched token; None when it does not occur."""
        node = self.root
        for k, t in enumerate(pattern):
            child = node.kids.get(t)
            if child is None:
                return None
            node = child
            if child.kids is None:  # a leaf: the rest of the pattern must follow in its sequence
                rest = len(pattern) - k - 1
                i = child.idx + rest
                if rest and (i >= self._leaf_end(child)
                             or child.seq[child.idx + 1:i + 1].tolist() != list(pattern[k + 1:])):
                    return None
                return node, i
        return node, None

    def _leaf_end(self, leaf: _Node) -> int:
        """One past the last index of the leaf's sequence inside the leaf (its owner's suffix, cut at
        max_depth)."""
        return min(len(leaf.seq), leaf.idx - leaf.depth + 1 + self.max_depth)

    def _in_leaf(self, leaf: _Node, i: int) -> bool:
        return i < self._leaf_end(leaf)

    def top_child(self, node: _Node, i: Optional[int]):
        """The most frequent continuation: ``(token, count, next position)`` or None."""
        if i is not None:
            j = i + 1
            return (node.seq[j], 1, (node, j)) if self._in_leaf(node, j) else None
        kids = node.kids
        if not kids:
            return None
        b = node.best
        if b is None or b not in kids:
            b = max(kids, key=lambda t: kids[t].count)
            node.best = b
        c = kids[b]
        return b, c.count, (c, c.idx if c.kids is None else None)

    def children(self, node: _Node, i: Optional[int], k: int) -> List[Tuple[int, int, Any]]:
        """Up to ``k`` continuations, most frequent first: ``[(token, count, next position)]``."""
        if i is not None or k == 1:
            c = self.top_child(node, i)
            return [c] if c is not None else []
        kids = node.kids
        items = heapq.nlargest(k, kids.items(), key=lambda kv: kv[1].count) if len(kids) > k else \
            sorted(kids.items(), key=lambda kv: -kv[1].count)
        return [(t, c.count, (c, c.idx if c.kids is None else None)) for t, c in items]

    @staticmethod
    def count_at(node: _Node, i: Optional[int]) -> int:
        return 1 if i is not None else node.count

    def num_nodes(self) -> int:
        """Nodes held (a walk of the whole tree; tests and reports)."""
        n, stack = 0, [self.root]
        while stack:
            x = stack.pop()
            n += 1
            if x.kids:
                stack.extend(x.kids.values())
        return n


# ------------------------------------------------------------------------------------- drafting
@dataclass
class Draft:
    """One speculation: ``tokens[j]`` with parent ``parents[j]`` (-1: the root, the pending token)
    and path probability ``probs[j]``; ``score`` = Σ probs; ``match_len``: the matched suffix length;
    ``source``: ``local`` or ``global``."""

    tokens: List[int] = field(default_factory=list)
    parents: List[int] = field(default_factory=list)
    probs: List[float] = field(default_factory=list)
    depths: List[int] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    source: str = ""


@dataclass(frozen=True)
class SpecLimits:
    """What one speculation may propose: ``max_tokens`` nodes (a chain: tokens), ``max_depth`` levels,
    ``topk`` children per node (1: a chain), ``factor`` (``max_spec_factor``: at most
    ``floor(match_len · factor)`` tokens), ``min_prob`` (``min_token_prob``, the floor of a node's
    path probability)."""

    max_tokens: int
    max_depth: int
    topk: int
    factor: float
    min_prob: float


def speculate(tree: SuffixTree, context: Sequence[int], lim: SpecLimits, own_tail: bool = False,
              source: str = "") -> Draft:
    """The best draft of ``tree`` continuing ``context`` (see the module docstring).

    Args:
        context: the request's last tokens (at most ``tree.max_depth`` are used).
        own_tail: the tree holds ``context`` as the end of one of its sequences (the local tree), so
            the matched node's count includes that occurrence, which continues nowhere: discounted.
    Returns: the highest-scoring :class:`Draft` (empty when nothing matches).
    """
    best = Draft(source=source)
    ctx = list(context[-tree.max_depth:])
    # the longest match M that occurs other than as the context's own tail (every shorter suffix of
    # such a match does too: a binary search), then the matches from M down while their token budget
    # floor(m · factor) could beat the best score (a score never exceeds the tokens drafted), skipping
    # a shorter match whose occurrences are those of the longer one (equal counts: the same
    # continuations, so the same draft unless the longer one was cut by the tree's depth): the same
    # draft as trying every m, ties to the longer match
    own = 1 if own_tail else 0
    lo, hi = 0, len(ctx) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        pos = tree.locate(ctx[len(ctx) - mid:])
        if pos is not None and SuffixTree.count_at(*pos) > own:
            lo = mid
        else:
            hi = mid - 1
    same = None  # (count, depth-capped) of the last match drafted, when the next may repeat it
    for m in range(lo, 0, -1):
        budget = min(lim.max_tokens, int(m * lim.factor + 1e-6))
        if budget <= best.score or budget <= 0:
            break
        if min(budget, tree.max_depth - m) <= best.score:  # the tree holds max_depth - m tokens below
            same = None
            continue
        pos = tree.locate(ctx[len(ctx) - m:])
        count = SuffixTree.count_at(*pos)
        if same is not None and same == (count, False):
            continue
        d = _draft(tree, pos, budget, lim, own_tail) if lim.topk > 1 else _path(tree, pos, budget, lim, own_tail)
        same = (count, m + max(d.depths, default=0) >= tree.max_depth)
        if d.tokens and d.score > best.score:
            d.match_len, d.source = m, source
            best = d
    return best


def _path(tree: SuffixTree, pos, budget: int, lim: SpecLimits, own_tail: bool) -> Draft:
    """A chain: follow the most frequent child while the path probability stays >= min_prob."""
    d = Draft()
    node, i = pos
    denom = SuffixTree.count_at(node, i) - (1 if own_tail else 0)
    p = 1.0
    want = min(budget, lim.max_depth)
    while len(d.tokens) < want:
        if i is not None:  # inside a leaf: the rest is its sequence, each token at frequency 1
            if denom <= 0:
                break
            p /= denom
            if p < lim.min_prob:
                break
            run = node.seq[i + 1:min(tree._leaf_end(node), i + 1 + want - len(d.tokens))].tolist()
            n0 = len(d.tokens)
            d.tokens += run
            d.parents += range(n0 - 1, n0 - 1 + len(run))
            d.probs += [p] * len(run)
            d.depths += range(n0 + 1, n0 + 1 + len(run))
            d.score += p * len(run)
            break
        c = tree.top_child(node, i)
        if c is None or denom <= 0:
            break
        tok, count, (node, i) = c
        p *= count / denom
        if p < lim.min_prob:
            break
        d.parents.append(len(d.tokens) - 1)
        d.tokens.append(tok)
        d.probs.append(p)
        d.depths.append(len(d.tokens))
        d.score += p
        denom = count
    return d


def _draft(tree: SuffixTree, pos, budget: int, lim: SpecLimits, own_tail: bool) -> Draft:
    """A tree: nodes best-first by path probability (a max-heap), ``topk`` children per node, at most
    ``max_depth`` levels and ``budget`` nodes, path probability >= min_prob. Nodes come out in a
    topological order (a child's probability never exceeds its parent's and it is pushed after)."""
    d = Draft()
    heap: List[Tuple[float, int, Any, int, int, int]] = []  # (-p, tie, position, count, parent, depth)
    tie = 0

    def expand(node, i, count, p, parent, depth, discount):
        nonlocal tie
        denom = count - discount
        if depth >= lim.max_depth or denom <= 0:
            return
        for tok, c, nxt in tree.children(node, i, lim.topk):
            q = p * c / denom
            if q < lim.min_prob:
                break  # children come most frequent first
            tie += 1
            heapq.heappush(heap, (-q, tie, (tok, nxt), c, parent, depth + 1))

    node, i = pos
    expand(node, i, SuffixTree.count_at(node, i), 1.0, -1, 0, 1 if own_tail else 0)
    while heap and len(d.tokens) < budget:
        negp, _, (tok, (node, i)), count, parent, depth = heapq.heappop(heap)
        j = len(d.tokens)
        d.tokens.append(tok)
        d.parents.append(parent)
        d.probs.append(-negp)
        d.depths.append(depth)
        d.score += -negp
        expand(node, i, count, -negp, j, depth, 0)
    return d


# ------------------------------------------------------------------------------------- the cache
class SuffixCache:
    """The local trees (one per runtime row) and the global tree, with its FIFO of finished outputs
    and its pinned documents.

    Args:
        max_depth: ``max_tree_depth``. max_cached_requests: finished outputs kept (FIFO; 0 disables
            the global tree's outputs). max_corpus_tokens: tokens of corpora and added documents.
    """

    def __init__(self, max_depth: int, max_cached_requests: int, max_corpus_tokens: int) -> None:
        if int(max_cached_requests) < 0:
            raise PlanError(f"method.suffix.max_cached_requests must be >= 0, got {max_cached_requests}")
        if int(max_corpus_tokens) < 0:
            raise PlanError(f"method.suffix.max_corpus_tokens must be >= 0, got {max_corpus_tokens}")
        self.max_depth = int(max_depth)
        self.max_cached_requests = int(max_cached_requests)
        self.max_corpus_tokens = int(max_corpus_tokens)
        self.global_tree = SuffixTree(self.max_depth)
        self.local: Dict[int, SuffixTree] = {}
        self.prompt_len: Dict[int, int] = {}
        self.cached: "OrderedDict[int, int]" = OrderedDict()  # seq id -> tokens, FIFO order
        self.documents: Dict[int, int] = {}  # seq id -> tokens (pinned)
        self.corpus_tokens = 0
        self.evicted = 0
        self._next_id = 0
        self.lock = threading.RLock()

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # ------------------------------------------------------------------ per request
    def start(self, row: int, history: Sequence[int], prompt_len: int) -> None:
        """Row ``row`` holds a new request whose history (prompt + first token) is ``history``. A
        request still held by the row (never released) is dropped without caching its output."""
        tree = SuffixTree(self.max_depth)
        tree.extend(0, history)
        self.local[row] = tree
        self.prompt_len[row] = int(prompt_len)

    def append(self, row: int, tokens: Sequence[int]) -> None:
        """Accepted tokens of row ``row``'s request, in order."""
        tree = self.local.get(row)
        if tree is not None and len(tokens):
            tree.extend(0, tokens)

    def length(self, row: int) -> int:
        """Tokens in row ``row``'s local tree (0 without one)."""
        tree = self.local.get(row)
        return len(tree.seqs[0]) if tree is not None and 0 in tree.seqs else 0

    def finish(self, row: int) -> None:
        """Row ``row``'s request finished: its output enters the global tree (FIFO-evicting the oldest
        past ``max_cached_requests``), its local tree goes."""
        tree = self.local.pop(row, None)
        plen = self.prompt_len.pop(row, 0)
        if tree is None or self.max_cached_requests == 0:
            return
        output = tree.seqs[0][plen:]
        if not len(output):
            return
        with self.lock:
            sid = self._new_id()
            self.global_tree.extend(sid, output)
            self.global_tree.close(sid)
            self.cached[sid] = len(output)
            while len(self.cached) > self.max_cached_requests:
                old, _ = self.cached.popitem(last=False)
                self.global_tree.remove(old)
                self.evicted += 1

    # ------------------------------------------------------------------ documents
    def reserve(self, num_tokens: int, what: str) -> None:
        """Claim ``num_tokens`` of the corpus bound for ``what``. Raises CorpusTooLarge naming
        ``method.suffix.max_corpus_tokens`` when it does not fit."""
        with self.lock:
            if self.corpus_tokens + num_tokens > self.max_corpus_tokens:
                raise CorpusTooLarge(
                    f"{what}: {num_tokens} tokens do not fit method.suffix.max_corpus_tokens="
                    f"{self.max_corpus_tokens} ({self.corpus_tokens} already held by corpora and documents); "
                    f"raise method.suffix.max_corpus_tokens or add less text")
            self.corpus_tokens += num_tokens

    def add_document(self, tokens: Sequence[int], what: str = "document") -> int:
        """Insert a pinned document into the global tree, :data:`INSERT_CHUNK` tokens per hold of the
        lock. Returns its sequence id. Raises CorpusTooLarge (nothing inserted) past the bound."""
        tokens = list(tokens)
        self.reserve(len(tokens), what)
        with self.lock:
            sid = self._new_id()
            self.documents[sid] = len(tokens)
        for c0 in range(0, len(tokens), INSERT_CHUNK):
            with self.lock:
                self.global_tree.extend(sid, tokens[c0:c0 + INSERT_CHUNK])
        with self.lock:
            self.global_tree.extend(sid, ())
            self.global_tree.close(sid)
        return sid

    def stats(self) -> Dict[str, int]:
        """Sizes for reports: requests cached and evicted, documents, tokens held."""
        return {"cached_requests": len(self.cached), "evicted_requests": self.evicted,
                "documents": len(self.documents), "corpus_tokens": self.corpus_tokens,
                "global_tokens": self.global_tree.num_tokens, "active_requests": len(self.local)}


# ------------------------------------------------------------------------------------- confidence
class FrequencyCalibration:
    """The acceptance of suffix drafts learned online, starting from their empirical frequency.

    A draft token's empirical frequency f (its count over its parent's) is the acceptance rate the
    trees predict; what the target really accepts also depends on the kind of match (measured on the
    shipped prompts: a first-position draft after a short match in a fresh answer is accepted far less
    often than f says, one inside a repeated answer about as often). Two levels, each a posterior
    mean with :attr:`PRIOR` pseudo-observations:

    * a **pool** per (source tree, first or later position) learns how much of f materialises:
      ``scale = (accepts + PRIOR) / (Σ f of its trials + PRIOR)``, so ``base = min(1, f · scale)``
      (f itself before any outcome);
    * a **key** (pool, matched length bucket, f bucket) refines it: ``(accepts + PRIOR · base) /
      (trials + PRIOR)``.

    A kind of draft never verified before therefore starts from what its pool has shown rather than
    from f (a unique continuation after a one-token match has f = 1; on fresh prompts the target
    accepts a fraction of that, and a budget that trusted f would verify every such draft). It depends
    only on the history and earlier steps' outcomes, never on the current step's randomness (vLLM's
    online acceptance estimator, keyed the same way for n-gram drafts in
    ``specc.methods.ngram.drafter``)."""

    PRIOR = 4.0
    MATCH_BUCKETS = (1, 2, 3, 5, 8, 13)

    def __init__(self) -> None:
        self.trials: Dict[Tuple, float] = {}
        self.accepts: Dict[Tuple, float] = {}
        self.pool_freq: Dict[Tuple, float] = {}  # pool -> Σ f over its observed drafts
        self.pool_accepts: Dict[Tuple, float] = {}

    def key(self, source: str, position: int, match_len: int, freq: float) -> Tuple:
        m = sum(1 for b in self.MATCH_BUCKETS if match_len >= b)
        return source, min(position, 1), m, min(4, int(freq * 5))

    def base(self, key: Tuple, freq: float) -> float:
        """The pool's calibrated acceptance of a draft of frequency ``freq``, in [0, 1]."""
        pool = key[:2]
        scale = (self.pool_accepts.get(pool, 0.0) + self.PRIOR) / (self.pool_freq.get(pool, 0.0) + self.PRIOR)
        return min(1.0, freq * scale)

    def confidence(self, key: Tuple, freq: float) -> float:
        """Posterior mean acceptance of a draft of kind ``key`` and frequency ``freq``, in [0, 1]."""
        return (self.accepts.get(key, 0.0) + self.PRIOR * self.base(key, freq)) / (self.trials.get(key, 0.0) + self.PRIOR)

    def observe(self, key: Tuple, accepted: bool, freq: float) -> None:
        """One verify outcome of a draft of kind ``key`` whose frequency was ``freq``."""
        pool = key[:2]
        self.trials[key] = self.trials.get(key, 0.0) + 1.0
        self.pool_freq[pool] = self.pool_freq.get(pool, 0.0) + float(freq)
        if accepted:
            self.accepts[key] = self.accepts.get(key, 0.0) + 1.0
            self.pool_accepts[pool] = self.pool_accepts.get(pool, 0.0) + 1.0


# ------------------------------------------------------------------------------------- the drafter
class SuffixDrafter(Drafter):
    """``method.name: suffix``: chains (κ, ``topk`` 1) or trees (``topk`` > 1) from the request's
    local suffix tree and the global one (see the module docstring).

    Args:
        max_tree_depth, max_cached_requests, max_spec_factor, min_token_prob: ``method.suffix.*``
            (vLLM's ``suffix_decoding_*``); max_corpus_tokens: the bound on corpus and document
            tokens in the global tree.
    Raises:
        PlanError: a value outside its range, naming the key (vLLM's rule 31, SP:1741-1760).
    """

    name = "suffix"
    supports_probabilistic = False
    supports_tree = True
    capturable = False
    prefill_row_index = True

    def __init__(self, max_tree_depth: int = DEFAULTS["max_tree_depth"],
                 max_cached_requests: int = DEFAULTS["max_cached_requests"],
                 max_spec_factor: float = DEFAULTS["max_spec_factor"],
                 min_token_prob: float = DEFAULTS["min_token_prob"],
                 max_corpus_tokens: int = DEFAULT_MAX_CORPUS_TOKENS) -> None:
        check_settings(max_tree_depth, max_cached_requests, max_spec_factor, min_token_prob, max_corpus_tokens)
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = float(min_token_prob)
        self.cache = SuffixCache(int(max_tree_depth), int(max_cached_requests), int(max_corpus_tokens))
        self.propose_s = 0.0  # host seconds in propose / propose_tree (reported by specc run)
        self.update_s = 0.0  # host seconds keeping the trees up to date (prefill, commit, release)
        self.num_proposals = 0
        self.num_global = 0  # proposals taken from the global tree
        self.calibration = FrequencyCalibration()
        self._pending: Dict[int, Tuple[List[Tuple], List[int]]] = {}  # row -> (keys, parents) of its last draft

    # ------------------------------------------------------------------ protocol
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Build the local trees of the new rows over their history (prompt + first token)."""
        t0 = time.perf_counter()
        rows = chunk.row_index.tolist() if chunk.row_index is not None else \
            [r for r, on in enumerate(chunk.rows.tolist()) if on]
        host = host_batch(batch)
        seq, plen, hist = host.seq_lens, host.prompt_lens, host.tokens
        for r in rows:
            self.cache.start(r, hist[r, :seq[r]].tolist(), plen[r])
        self.update_s += time.perf_counter() - t0

    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Learn the calibration from this step's outcome, then extend each live row's local tree with
        the tokens the step appended to its history."""
        t0 = time.perf_counter()
        if self._pending and step.num_steps > 0 and step.num_valid is not None:
            self._observe(step)
        self._pending = {}
        host = host_batch(batch)  # the step's host copy of the rows: no device read
        seq, active, hist = host.seq_lens, host.active, host.tokens
        for r in range(len(seq)):
            if not active[r] or r not in self.cache.local:
                continue
            have = self.cache.length(r)
            if seq[r] > have:
                self.cache.append(r, hist[r, have:seq[r]].tolist())
        self.update_s += time.perf_counter() - t0

    def _observe(self, step: VerifyStep) -> None:
        """Which drafts of each row were verified and which accepted: a chain's positions up to the
        first rejection (within the verified ones); a tree's children of the accepted path's nodes."""
        host = host_verify(step)  # the step's one read of its results: no device read here
        valid, accepted, path_nodes = host.num_valid, host.accepted, host.accept_index
        for r, (keys, parents) in self._pending.items():
            if r >= len(valid):
                continue
            n, a = min(int(valid[r]), len(keys)), int(accepted[r])
            if path_nodes is None:
                for i in range(min(a + 1, n)):
                    key, f = keys[i]
                    self.calibration.observe(key, i < a, f)
                continue
            on_path = {j - 1 for j in path_nodes[r][1:a + 1]}  # tree node j + 1 = draft j
            tested = on_path | {-1}
            for j in range(n):
                if parents[j] in tested:
                    key, f = keys[j]
                    self.calibration.observe(key, j in on_path, f)

    def release(self, row: int) -> None:
        """Row ``row``'s request finished (or was cancelled): its output joins the global tree."""
        t0 = time.perf_counter()
        self.cache.finish(row)
        self.update_s += time.perf_counter() - t0

    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """A chain per row: tokens ``[B, κ]`` (0-padded), num_valid ``[B]``, confidence ``[B, κ]`` (the
        conditional frequency of each draft given the ones before it)."""
        t0 = time.perf_counter()
        B = batch.batch_size
        tokens = np.zeros((B, num_steps), dtype=np.int64)
        valid = np.zeros(B, dtype=np.int64)
        conf = np.zeros((B, num_steps), dtype=np.float32)
        for r, d in self._drafts(batch, num_steps, num_steps, 1):
            n = len(d.tokens)
            tokens[r, :n] = d.tokens
            valid[r] = n
            conf[r, :n] = self._confidence(r, d, chain=True)
        dev = batch.tokens.device
        out = Proposal(tokens=_to(tokens, dev), num_valid=_to(valid, dev),
                       confidence=_to(conf, dev))
        self.propose_s += time.perf_counter() - t0
        return out

    def propose_tree(self, batch: BatchView, tree: TreeRequest, sampling: DraftSampling) -> Proposal:
        """A draft tree per row of at most ``tree.num_nodes`` nodes, ``tree.topk`` children per node,
        ``tree.num_steps`` levels: tokens, parents, depths, confidence (path probabilities) ``[B, N]``;
        num_valid ``[B]`` (a prefix of the nodes). Raises ValueError for a static tree or
        probabilistic drafts (suffix drafts are one-hot)."""
        if tree.static is not None:
            raise ValueError("suffix decoding drafts dynamic trees (method.topk > 1), not method.tree_choices")
        t0 = time.perf_counter()
        B, N = batch.batch_size, int(tree.num_nodes)
        tokens = np.zeros((B, N), dtype=np.int64)
        parents = np.zeros((B, N), dtype=np.int64)
        depths = np.ones((B, N), dtype=np.int64)
        conf = np.zeros((B, N), dtype=np.float32)
        valid = np.zeros(B, dtype=np.int64)
        for r, d in self._drafts(batch, N, int(tree.num_steps), max(1, int(tree.topk))):
            n = len(d.tokens)
            tokens[r, :n] = d.tokens
            parents[r, :n] = np.asarray(d.parents, dtype=np.int64) + 1  # node 0 is the root
            depths[r, :n] = d.depths
            conf[r, :n] = self._confidence(r, d, chain=False)
            valid[r] = n
        if N:  # unused nodes: a chain below the last real one (never proposed: num_valid stops before)
            idx = np.arange(N)
            parents = np.where(idx[None, :] < valid[:, None], parents, 0)
        dev = batch.tokens.device
        out = Proposal(tokens=_to(tokens, dev), num_valid=_to(valid, dev),
                       confidence=_to(conf, dev), parents=_to(parents, dev),
                       depths=_to(depths, dev))
        self.propose_s += time.perf_counter() - t0
        return out

    def _confidence(self, row: int, d: "Draft", chain: bool) -> List[float]:
        """Calibrated confidences of a draft (:class:`FrequencyCalibration`): a chain's per-position
        conditional acceptance, a tree's per-node path probability. Remembers the draft's keys so
        ``commit`` can learn from its outcome."""
        keys, cond = [], []
        for j, (p, par) in enumerate(zip(d.probs, d.parents)):
            f = p / (d.probs[par] if par >= 0 else 1.0)  # the node's frequency given its parent
            k = self.calibration.key(d.source, d.depths[j] - 1, d.match_len, f)
            keys.append((k, f))
            cond.append(self.calibration.confidence(k, f))
        self._pending[row] = (keys, list(d.parents))
        if chain:
            return cond
        out = []
        for j, par in enumerate(d.parents):
            out.append(cond[j] * (out[par] if par >= 0 else 1.0))
        return out

    def _drafts(self, batch: BatchView, max_tokens: int, max_depth: int, topk: int):
        """``(row, Draft)`` for every live row that drafts something."""
        host = host_batch(batch)  # the step's host copy of the rows: no device read
        seq, active, cap, hist = host.seq_lens, host.active, host.max_draft, host.tokens
        want = [r for r in range(batch.batch_size) if active[r] and cap[r] > 0 and r in self.cache.local]
        if not want:
            return
        depth = self.cache.max_depth
        with self.cache.lock:
            for r in want:
                lim = SpecLimits(max_tokens=max_tokens if topk > 1 else min(max_tokens, cap[r]),
                                 max_depth=min(max_depth, cap[r]), topk=topk, factor=self.max_spec_factor,
                                 min_prob=self.min_token_prob)
                ctx = hist[r, max(0, seq[r] - depth):seq[r]].tolist()
                d = speculate(self.cache.local[r], ctx, lim, own_tail=True, source="local")
                if self.cache.global_tree.num_tokens:
                    g = speculate(self.cache.global_tree, ctx, lim, source="global")
                    if g.score > d.score:
                        d = g
                if d.tokens:
                    self.num_proposals += 1
                    self.num_global += d.source == "global"
                    yield r, d

    # ------------------------------------------------------------------ corpora
    def add_document(self, tokens: Sequence[int], what: str = "document") -> Dict[str, int]:
        """Add a document (token ids) to the global tree; safe to call from another thread while the
        runtime decodes. Returns ``{"tokens", "corpus_tokens", "max_corpus_tokens"}``. Raises
        CorpusTooLarge naming ``method.suffix.max_corpus_tokens`` when it does not fit (nothing added)."""
        t0 = time.perf_counter()
        self.cache.add_document(tokens, what)
        self.update_s += time.perf_counter() - t0
        return {"tokens": len(tokens), "corpus_tokens": self.cache.corpus_tokens,
                "max_corpus_tokens": self.cache.max_corpus_tokens}

    def host_report(self) -> Dict[str, Any]:
        """Host work and sizes for ``specc run``'s metrics."""
        return dict(self.cache.stats(), propose_s=round(self.propose_s, 4), update_s=round(self.update_s, 4),
                    num_proposals=self.num_proposals, num_global_proposals=self.num_global)


def check_settings(max_tree_depth: Any, max_cached_requests: Any, max_spec_factor: Any, min_token_prob: Any,
                   max_corpus_tokens: Any) -> None:
    """Raise PlanError naming every ``method.suffix`` key outside its range (vLLM rule 31,
    SP:1741-1760: depth >= 1, cached requests >= 0, factor >= 0, probability in [0, 1]; corpus tokens
    >= 0)."""
    bad = []

    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

    if not (isinstance(max_tree_depth, int) and max_tree_depth >= 1):
        bad.append(f"method.suffix.max_tree_depth={max_tree_depth!r} must be an integer >= 1")
    if not (isinstance(max_cached_requests, int) and max_cached_requests >= 0):
        bad.append(f"method.suffix.max_cached_requests={max_cached_requests!r} must be an integer >= 0 "
                   f"(0 keeps no earlier outputs)")
    if not (num(max_spec_factor) and max_spec_factor >= 0):
        bad.append(f"method.suffix.max_spec_factor={max_spec_factor!r} must be a number >= 0")
    if not (num(min_token_prob) and 0 <= min_token_prob <= 1):
        bad.append(f"method.suffix.min_token_prob={min_token_prob!r} must be a probability in [0, 1]")
    if not (isinstance(max_corpus_tokens, int) and max_corpus_tokens >= 0):
        bad.append(f"method.suffix.max_corpus_tokens={max_corpus_tokens!r} must be an integer >= 0")
    if bad:
        raise PlanError("; ".join(bad))


def settings(spec: Dict[str, Any]) -> Dict[str, Any]:
    """``method.suffix`` of an artifact's runtime section with the defaults filled in."""
    sx = dict((spec.get("method") or {}).get("suffix") or {})
    out = {k: sx.get(k) if sx.get(k) is not None else v for k, v in DEFAULTS.items()}
    out["max_corpus_tokens"] = sx.get("max_corpus_tokens") if sx.get("max_corpus_tokens") is not None \
        else DEFAULT_MAX_CORPUS_TOKENS
    out["corpora"] = list(sx.get("corpora") or [])
    return out


def build_drafter(spec, target=None, tokenizer=None, device=None, max_seq_len=None) -> SuffixDrafter:
    """Runtime factory of ``method.name: suffix`` from the artifact's runtime section: the settings of
    ``spec["method"]["suffix"]`` (defaults: vLLM's), then the plan's corpora tokenized into the global
    tree (:func:`specc.methods.suffix.corpus.read_corpus`).

    Raises:
        PlanError: a setting out of range. specc.methods.suffix.corpus.CorpusNotFound: a corpus that does not exist.
        specc.methods.suffix.corpus.CorpusTooLarge: corpora past ``method.suffix.max_corpus_tokens``.
    """
    s = settings(spec)
    drafter = SuffixDrafter(s["max_tree_depth"], s["max_cached_requests"], s["max_spec_factor"],
                            s["min_token_prob"], s["max_corpus_tokens"])
    if s["corpora"]:
        from specc.methods.suffix.corpus import load_corpora

        load_corpora(drafter, s["corpora"], tokenizer, target_path=(spec.get("target") or {}).get("path"))
    return drafter


def _to(a, device) -> torch.Tensor:
    """A host numpy array on ``device`` (on CUDA a non-blocking copy: staged from pageable memory
    before the call returns, no stream synchronisation)."""
    t = torch.from_numpy(a)
    return t.to(device, non_blocking=True) if torch.device(device).type == "cuda" else t.to(device)
