"""Embedding tables, fused by width: all tables of one width live in one weight matrix with
row offsets, so a forward pass does one lookup per width instead of one per table.

Gradients are sparse (one row per lookup, never a dense [rows, dim] tensor); the sparse
optimizers in dlrmkit.optim apply them to the touched rows only. A table can also defer its
gradient (`defer_grads`): backward then keeps the pooled gradient and each lookup's bag instead
of copying one gradient row per lookup, and an optimizer that understands it (split-SGD's fused
kernel) reads the rows straight from the pooled gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class JaggedIds:
    """Multi-hot ids, table-major (torchrec's KeyedJaggedTensor layout without the keys):
    the bag of table t, sample b is values[offsets[t*B + b] : offsets[t*B + b + 1]]."""

    values: torch.Tensor  # int64 [nnz]
    offsets: torch.Tensor  # int64 [T*B + 1]
    batch_size: int

    @classmethod
    def from_dense(cls, ids: torch.Tensor) -> "JaggedIds":
        """One id per (sample, table) from a [B, T] tensor."""
        b, t = ids.shape
        return cls(ids.t().reshape(-1), torch.arange(b * t + 1, dtype=torch.int64), b)

    @property
    def num_tables(self) -> int:
        return (len(self.offsets) - 1) // self.batch_size

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "JaggedIds":
        """The same ids on `device` (itself when already there), as Tensor.to."""
        return JaggedIds(
            self.values.to(device, non_blocking=non_blocking),
            self.offsets.to(device, non_blocking=non_blocking),
            self.batch_size,
        )

    def pin_memory(self) -> "JaggedIds":
        """The same ids in page-locked host memory, as Tensor.pin_memory."""
        return JaggedIds(self.values.pin_memory(), self.offsets.pin_memory(), self.batch_size)

    def sample_major(self, table_offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, offsets) reordered so bag (b, t) comes at position b*T + t: a lookup in this
        order yields [B, T, dim] contiguously, with no transpose or copy of the pooled rows.
        `table_offsets` [T], if given, is added to each value of its table on the way."""
        b, t = self.batch_size, self.num_tables
        lengths = self.offsets.diff()
        new_lengths = lengths.view(t, b).t().reshape(-1)
        dev = self.values.device
        new_offsets = torch.zeros(b * t + 1, dtype=torch.int64, device=dev)
        torch.cumsum(new_lengths, 0, out=new_offsets[1:])
        # destination bag of each source bag (table-major k = t*B + b -> b*T + t)
        dest_bag = torch.arange(b * t, device=dev).view(b, t).t().reshape(-1)
        shift = new_offsets[:-1].index_select(0, dest_bag) - self.offsets[:-1]
        bag = bag_of_each(self.offsets, len(self.values))
        positions = torch.arange(len(self.values), device=dev) + shift.index_select(0, bag)
        src = self.values
        if table_offsets is not None:
            src = src + table_offsets.repeat_interleave(b).index_select(0, bag)
        return torch.empty_like(self.values).scatter_(0, positions, src), new_offsets

    def table_lengths(self) -> torch.Tensor:
        """Number of ids per table, [T]."""
        bounds = self.offsets[:: self.batch_size]
        return bounds[1:] - bounds[:-1]


Ids = torch.Tensor | JaggedIds  # [B, T] one-hot ids, or multi-hot jagged ids


def bag_of_each(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The bag of each of the n values in bags `offsets` [bags + 1] (empty bags allowed), i.e.
    repeat_interleave(arange(bags), lengths), done faster (benchmarks/bench_id_prep.py,
    docs/BENCHMARKS.md): a 1 at each later bag's start, then a running sum."""
    if len(offsets) <= 2:  # one bag (or none): every value is in bag 0
        return torch.zeros(n, dtype=torch.int64, device=offsets.device)
    starts = torch.zeros(n + 1, dtype=torch.int64, device=offsets.device)
    starts.scatter_add_(0, offsets[1:-1], torch.ones(len(offsets) - 2, dtype=torch.int64, device=offsets.device))
    return starts[:n].cumsum(0)


def regroup(values: torch.Tensor, lengths: torch.Tensor, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bags reordered: new bag i is old bag order[i] (values moved with their bags)."""
    starts = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=starts[1:])
    new_lengths = lengths.index_select(0, order)
    new_starts = torch.zeros(len(order) + 1, dtype=torch.int64)
    torch.cumsum(new_lengths, 0, out=new_starts[1:])
    n = int(new_starts[-1])
    shift = (starts.index_select(0, order) - new_starts[:-1]).index_select(0, bag_of_each(new_starts, n))
    return values.index_select(0, torch.arange(n) + shift), new_lengths


def to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Bag offsets [bags + 1] of bag lengths."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


INIT_CHUNK_ROWS = 1 << 16  # rows per independently seeded init chunk


def draw_base_seed(generator: torch.Generator) -> int:
    """The one number a collection's initialization takes from the model's generator."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


@torch.no_grad()
def init_table_block(
    out: torch.Tensor, base: int, table: int, table_rows: int, dim: int, row_start: int = 0, col_start: int = 0
) -> None:
    """Fill `out` with rows [row_start, +len(out)) and columns [col_start, +out.shape[1]) of
    the init of table `table` ([table_rows, dim], uniform +-sqrt(1/rows), but row 0 zero). Each chunk of
    INIT_CHUNK_ROWS rows has its own generator, seeded by (base, table, chunk), so a shard gets
    exactly its block of the single-device init while generating at most one chunk
    ([INIT_CHUNK_ROWS, dim]) at a time and only the chunks its rows fall in."""
    import numpy as np

    rows, cols = out.shape
    bound = math.sqrt(1.0 / table_rows)
    row_end = row_start + rows
    for c in range(row_start // INIT_CHUNK_ROWS, (row_end - 1) // INIT_CHUNK_ROWS + 1 if rows else 0):
        lo, hi = c * INIT_CHUNK_ROWS, min((c + 1) * INIT_CHUNK_ROWS, table_rows)
        seed = int(np.random.SeedSequence([base, table, c]).generate_state(1, np.uint64)[0]) >> 1
        block = torch.empty(hi - lo, dim).uniform_(-bound, bound, generator=torch.Generator().manual_seed(seed))
        a, b = max(lo, row_start), min(hi, row_end)
        out[a - row_start : b - row_start] = block[a - lo : b - lo, col_start : col_start + cols].to(out.dtype)
    if row_start == 0 and rows:
        # id 0 is the id of unseen, rare and missing values (data/id_counts.py): it starts at zero, so
        # a value no training row had adds nothing to the logit rather than its random start
        out[0] = 0


# Deferred gradients of tables at least this wide are sorted by row, so the update walks the table in
# order. With the vectorized row kernel, lookup order won alone at every width measured
# (benchmarks/bench_table_update.py), but whole mlperf-shape steps (128 wide) tied either way; so
# narrower tables skip the sort and 128 keeps it, unchanged where it was measured a tie (figures:
# docs/BENCHMARKS.md, table update kernels).
SORT_MIN_DIM = 128


@dataclass
class BagGrad:
    """A table's gradient kept by bag: lookup i adds grad[bags[i]] to row rows[i]; duplicates of a
    row apply in lookup order on the CPU (a GPU's SparseSGD adds them atomically, in no set order).
    The same gradient as the sparse COO tensor (rows, grad[bags]) without its [lookups, dim] copy."""

    rows: torch.Tensor  # int64 [lookups], sorted (dim >= SORT_MIN_DIM, on the CPU) or in lookup order
    bags: torch.Tensor  # int64 [lookups], row of `grad` each lookup takes
    grad: torch.Tensor  # [bags, dim], the pooled output's gradient (any strides; read at update time)

    def to_sparse(self, shape: torch.Size) -> torch.Tensor:
        return torch.sparse_coo_tensor(
            self.rows.unsqueeze(0), self.grad.index_select(0, self.bags), shape, check_invariants=False
        )


class PooledLookup(torch.autograd.Function):
    """Sum-pooled lookup whose weight gradient is sparse and sorted by row: one gradient row per
    lookup, ordered by id, so the optimizer's scatter walks the table in order (faster than
    random order on a large table, measured in docs/BENCHMARKS.md). With a `sink` list, the
    gradient is appended there as a BagGrad and the weight gets none (see FusedTable.defer_grads);
    a narrow table's BagGrad stays in lookup order (SORT_MIN_DIM)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, sink: list | None = None):
        ctx.save_for_backward(values, offsets)
        ctx.weight_shape, ctx.sink = weight.shape, sink
        return F.embedding_bag(values, weight, offsets[:-1], mode="sum")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        values, offsets = ctx.saved_tensors
        bags = bag_of_each(offsets, len(values))
        # sorted for a COO gradient (sink None) and for the CPU kernel's walk of a wide table; a GPU's
        # deferred update adds atomically (SparseSGD), so it takes the lookups in any order
        if ctx.sink is None or (ctx.weight_shape[1] >= SORT_MIN_DIM and not values.is_cuda):
            # duplicates keep lookup order (the fp32 sum order is defined); int32 keys sort in half the time
            keys = values.int() if ctx.weight_shape[0] <= torch.iinfo(torch.int32).max else values
            rows, order = keys.sort(stable=True)
            values, bags = rows.long(), bags.index_select(0, order)
        bag_grad = BagGrad(values, bags, grad)  # not read here: it may still be arriving (parallel PooledAllToAll)
        if ctx.sink is not None:
            ctx.sink.append(bag_grad)
            return None, None, None, None
        return bag_grad.to_sparse(ctx.weight_shape), None, None, None


class FusedTable(nn.Module):
    """Tables of one width in one [sum(rows), dim] weight; `row_offsets` maps table-local ids."""

    def __init__(self, table_sizes: list[int], dim: int, device: torch.device | str | None = None):
        super().__init__()
        self.table_sizes, self.dim = list(table_sizes), dim
        starts = [0]
        for rows in self.table_sizes[:-1]:
            starts.append(starts[-1] + rows)
        self.register_buffer("row_offsets", torch.tensor(starts, dtype=torch.int64), persistent=False)
        self.weight = nn.Parameter(torch.empty(sum(self.table_sizes), dim, device=device))
        self.deferred = False

    def defer_grads(self) -> None:
        """From now on backward leaves `weight.grad` unset and appends a BagGrad to the list
        `weight.bag_grads` instead; the optimizer must consume and clear that list (SplitSGD)."""
        self.deferred = True
        self.weight.bag_grads = []

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator, table_ids: list[int] | None = None) -> None:
        """Each table uniform in +-sqrt(1/rows), as the DLRM reference initializes it; table i
        is seeded by (a base seed drawn from `generator`, table_ids[i]) (see init_table_block)."""
        self.init_tables(draw_base_seed(generator), table_ids or list(range(len(self.table_sizes))))

    @torch.no_grad()
    def init_tables(self, base: int, table_ids: list[int]) -> None:
        for offset, rows, t in zip(self.row_offsets.tolist(), self.table_sizes, table_ids):
            init_table_block(self.weight[offset : offset + rows], base, t, rows, self.dim)

    def forward(self, ids: Ids) -> torch.Tensor:
        """Pooled (sum) embeddings [B, T, dim] of these tables."""
        sink = self.weight.bag_grads if self.deferred and torch.is_grad_enabled() else None
        if isinstance(ids, torch.Tensor):
            if sink is None:
                return F.embedding(ids + self.row_offsets, self.weight, sparse=True)
            b, t = ids.shape  # one id per bag, sample-major
            offsets = torch.arange(b * t + 1, dtype=torch.int64, device=ids.device)
            return PooledLookup.apply(self.weight, (ids + self.row_offsets).reshape(-1), offsets, sink).view(
                b, t, self.dim
            )
        fused, offsets = ids.sample_major(self.row_offsets)
        return PooledLookup.apply(self.weight, fused, offsets, sink).view(
            ids.batch_size, len(self.table_sizes), self.dim
        )


def select_tables(ids: Ids, tables: list[int]) -> Ids:
    """The ids of a subset of tables, in the given order."""
    if isinstance(ids, torch.Tensor):
        return ids[:, tables]
    b = ids.batch_size
    starts, ends = ids.offsets[:-1].view(-1, b), ids.offsets[1:].view(-1, b)
    pieces, lengths = [], []
    for t in tables:
        lo, hi = int(starts[t, 0]), int(ends[t, -1])
        pieces.append(ids.values[lo:hi])
        lengths.append(ends[t] - starts[t])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(lengths).cumsum(0)])
    return JaggedIds(torch.cat(pieces), offsets, b)


@dataclass(frozen=True, eq=False)  # identity: comparing the weights elementwise is never meant
class TablePiece:
    """Rows [row_start, row_end) x columns [col_start, col_end) of logical table `table`, as
    an embedding module holds it (`logical_shards`). `rank`: the process holding it when the
    table is split over processes (None: this process holds the whole table). `weight` and
    `offset`: the piece is rows [offset, offset + rows) of that live weight (None on a piece
    another process holds), so a row-sized optimizer state of the weight slices the same way."""

    table: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    rank: int | None = None
    weight: nn.Parameter | None = None
    offset: int = 0

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start

    def rows_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """This piece's rows of `weight`, or of a tensor with one row per row of `weight`."""
        return tensor[self.offset : self.offset + self.rows]

    @property
    def data(self) -> torch.Tensor:
        """The piece of the live weight, a view outside autograd (in-place writes restore it)."""
        return self.rows_of(self.weight.data)


def fused_pieces(tables: list[int], fused: FusedTable) -> list[TablePiece]:
    """Whole-table pieces of the tables `tables` fused in `fused`, in its order."""
    return [
        TablePiece(t, 0, rows, 0, fused.dim, None, fused.weight, offset)
        for t, offset, rows in zip(tables, fused.row_offsets.tolist(), fused.table_sizes)
    ]


class EmbeddingCollection(nn.Module):
    """All categorical tables of a model. forward(ids) -> [B, T, dim] when every table has the
    same width (what the dot interaction needs), else the concatenation [B, sum(dims)]."""

    def __init__(self, table_sizes: list[int], dims: list[int], device: torch.device | str | None = None):
        super().__init__()
        if len(table_sizes) != len(dims):
            raise ValueError("one dim per table is needed")
        self.table_sizes, self.dims = list(table_sizes), list(dims)
        widths = sorted(set(dims))
        self.groups = [[t for t, d in enumerate(dims) if d == w] for w in widths]
        self.tables = nn.ModuleList(
            FusedTable([table_sizes[t] for t in group], w, device) for group, w in zip(self.groups, widths)
        )

    @property
    def uniform(self) -> bool:
        return len(self.groups) == 1

    def reset_parameters(self, generator: torch.Generator) -> None:
        base = draw_base_seed(generator)  # one draw: a sharded collection draws the same and inits its shards
        for group, table in zip(self.groups, self.tables):
            table.init_tables(base, group)

    def logical_shards(self) -> list[TablePiece]:
        """Every table as one whole piece of its fused weight (checkpoints save these)."""
        return [p for group, table in zip(self.groups, self.tables) for p in fused_pieces(group, table)]

    def forward(self, ids: Ids) -> torch.Tensor:
        if self.uniform:
            return self.tables[0](ids)
        outputs: list[torch.Tensor | None] = [None] * len(self.dims)
        for group, table in zip(self.groups, self.tables):
            pooled = table(select_tables(ids, group))
            for i, t in enumerate(group):
                outputs[t] = pooled[:, i]
        return torch.cat(outputs, dim=1)  # type: ignore[arg-type]
