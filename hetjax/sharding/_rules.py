"""Logical-axis rules: data that maps the logical names models use onto mesh axes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from jax.sharding import Mesh, PartitionSpec

from hetjax._errors import ShardingError

MeshAxes = tuple[str, ...]


def _as_axes(value: str | Sequence[str] | None) -> MeshAxes:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  return tuple(value)


def padded(names: Sequence[str | None], rank: int) -> tuple[str | None, ...]:
  """``names`` with ``None`` appended up to ``rank``: fewer names than dimensions leave the
  trailing dimensions unnamed (replicated), as JAX and Flax read a shorter `PartitionSpec`.

  Flax's own ``nnx.MultiHeadAttention`` kernels, of shape ``(in_features, num_heads,
  head_dim)``, are typically annotated with two names::

    >>> padded(('embed', 'heads'), 3)
    ('embed', 'heads', None)

  More names than ``rank`` are returned as they are (`LogicalRules.checked_spec` refuses them).
  """
  return tuple(names) + (None,) * (rank - len(names))


def dimension_names(names: Iterable[str | Sequence[str] | None]) -> tuple[str, ...]:
  """The logical names in one array's ``names``, in order: a dimension's ``None`` is skipped and
  a tuple of names (Flax allows several on one dimension) gives each of its names."""
  out = []
  for entry in names:
    for name in (entry,) if entry is None or isinstance(entry, str) else entry:
      if isinstance(name, str):
        out.append(name)
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class LogicalRules:
  """An ordered table of ``(logical name, mesh axes)`` pairs.

  Models name the dimensions of their parameters and activations with logical names such as
  ``'batch'``, ``'embed'`` or ``'mlp'``; a rule table says which mesh axes each name is split
  over. The table is plain data, so a plan can carry it and a checkpoint can record it.

  Resolution follows Flax's ``logical_to_mesh_axes``: for each dimension, the first rule for its
  name whose mesh axes are still unused in this array is taken; a name with no usable rule is
  replicated. A mesh axis therefore never shards two dimensions of one array.

  Example::

    >>> rules = LogicalRules.of({'batch': 'data', 'mlp': 'model'})
    >>> rules.spec(('batch', 'mlp'))
    PartitionSpec('data', 'model')
    >>> rules.spec(('embed', 'mlp'))   # 'embed' has no rule: replicated
    PartitionSpec(None, 'model')

  A table may also name ``fallback`` mesh axes for arrays that no rule splits (every dimension
  unnamed, named but without a rule here, or named by a rule whose mesh axes do not divide it):
  `checked_spec` then splits the largest dimension they divide. FSDP uses it, so that a
  parameter is sharded whatever its model called it::

    fsdp = LogicalRules.of({'embed': ('data', 'model')}, fallback=('data', 'model'))
    fsdp.checked_spec((None, None), (6, 8), mesh_4x2, 'w')  # P(None, ('data', 'model')): 8 | 8
    fsdp.checked_spec((None,), (10,), mesh_4x2, 'b')        # P(None,): 8 divides no dimension
    fsdp.checked_spec((None, 'embed'), (16, 10), mesh_4x2, 'w')  # P(('data', 'model'), None)

  A plan that lays out each sub-model differently carries one table per sub-model in
  ``scopes``: inside `hetjax.sharding.scope('tower')` (activations) or for parameters under the
  sub-model ``'tower'``, `in_scope('tower')` is used instead of the top-level table.

  An array may carry fewer names than dimensions: the trailing ones are replicated, as JAX and
  Flax read a shorter `PartitionSpec` (`padded`). Rules given on top of a table (a run's
  ``parallelism.rules``) come first, so they win: `overlay`.

  Attributes:
    rules: ``(logical name, mesh axes)`` pairs; mesh axes is a tuple of axis names, ``()`` for
      replicated. Several pairs may name the same logical axis: they are tried in order.
    scopes: ``(sub-model name, rules)`` pairs overriding the table inside that sub-model.
    fallback: mesh axes for an array none of whose dimensions a rule splits, applied by
      `checked_spec` only (it needs the shape): its largest dimension divisible by their total
      size (the first of equal ones) is split over them; ``()`` (default) replicates it.
      A dimension whose name an `overlay` rule replicates is never the one split. With a
      fallback, the table's own rules give way: one whose mesh axes do not divide its dimension
      leaves it whole (`checked_spec`, `relaxed`). A scope's table has its own ``fallback``.
    optional: logical names whose rules give way where their mesh axes do not divide the
      dimension (it is left whole), in any table: a model's key/value heads (``'kv_heads'``)
      split with the query heads where their count divides, and stay whole where it does not
      (multi-query attention). Activations too (`spec_for`, what `constrain` uses).
    sources: ``(logical name, where its first rule came from)`` pairs, e.g.
      ``(('kv', 'parallelism.rules'),)``, set by `overlay`: an error about a dimension that rule
      splits names it (``parallelism.rules['kv']``), and ``fallback`` leaves a dimension it
      replicates whole.
  """

  rules: tuple[tuple[str, MeshAxes], ...] = ()
  scopes: tuple[tuple[str, LogicalRules], ...] = ()
  fallback: MeshAxes = ()
  sources: tuple[tuple[str, str], ...] = ()
  optional: frozenset[str] = frozenset()

  @classmethod
  def of(cls, mapping: Mapping[str, str | Sequence[str] | None],
         fallback: str | Sequence[str] | None = None,
         optional: Sequence[str] = ()) -> LogicalRules:
    """Builds rules from a ``{logical name: mesh axis or axes or None}`` mapping."""
    return cls(tuple((name, _as_axes(axes)) for name, axes in mapping.items()),
               fallback=_as_axes(fallback), optional=frozenset(optional))

  def overlay(self, mapping: Mapping[str, str | Sequence[str] | None], source: str = ''
              ) -> LogicalRules:
    """This table with ``mapping``'s rules first, in every scope too: resolution takes the first
    usable rule of a name, so a name given here is split as ``mapping`` says, and ``None`` (or
    ``()``) replicates it whatever this table's rule for it was.

    Example::

      >>> tp = LogicalRules.of({'heads': 'model', 'mlp': 'model'})
      >>> tp.overlay({'heads': None, 'kv': 'model'}).spec(('embed', 'heads', 'kv'))
      PartitionSpec(None, None, 'model')

    Args:
      mapping: ``{logical name: mesh axis or axes or None}``.
      source: where ``mapping`` came from (e.g. ``'parallelism.rules'``), named in errors
        about the dimensions its rules split (`checked_spec`).
    """
    first = tuple((name, _as_axes(axes)) for name, axes in mapping.items())
    given = tuple((name, source) for name, _ in first) if source else ()
    return dataclasses.replace(
        self, rules=first + self.rules,
        scopes=tuple((scope, rules.overlay(mapping, source)) for scope, rules in self.scopes),
        sources=given + tuple(p for p in self.sources if p[0] not in mapping))

  def named(self) -> frozenset[str]:
    """Every logical name a rule of this table or of one of its scopes names (replicating rules
    included): the names this table decides; any other name is replicated."""
    return frozenset(name for name, _ in self.rules).union(
        *(rules.named() for _, rules in self.scopes))

  def in_scope(self, name: str | None) -> LogicalRules:
    """The table that applies inside sub-model ``name`` (this one if it has none of its own)."""
    for scope, rules in self.scopes:
      if scope == name:
        return rules
    return self

  def mesh_axes(self, names: Sequence[str | None]) -> tuple[MeshAxes, ...]:
    """Returns the mesh axes of every dimension, mesh axes used at most once overall."""
    used: set[str] = set()
    out = []
    for name in names:
      chosen: MeshAxes = ()
      if name is not None:
        for rule_name, axes in self.rules:
          if rule_name == name and not used.intersection(axes):
            chosen = axes
            break
      used.update(chosen)
      out.append(chosen)
    return tuple(out)

  def spec_for(self, names: Sequence[str | None], shape: Sequence[int], mesh: Mesh
               ) -> PartitionSpec:
    """`spec` for an array of ``shape`` on ``mesh`` (an activation): an `optional` name whose
    mesh axes do not divide its dimension leaves it whole.

    Example::

      rules = LogicalRules.of({'heads': 'model', 'kv_heads': 'model'}, optional=['kv_heads'])
      rules.spec_for(('batch', 'seq', 'kv_heads'), (8, 16, 1), mesh_4x2)  # P(None, None, None)
    """
    names = padded(names, len(shape))
    if self.optional:
      axes_of = self.mesh_axes(names)
      names = tuple(None if name in self.optional and axes and size % math.prod(
          mesh.shape[a] for a in axes if a in mesh.shape) else name
                    for name, size, axes in zip(names, shape, axes_of, strict=True))
    return self.spec(names)

  def spec(self, names: Sequence[str | None]) -> PartitionSpec:
    """Returns the `PartitionSpec` for an array whose dimensions carry ``names``."""
    entries = []
    for axes in self.mesh_axes(names):
      entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)

  def checked_spec(
      self, names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, what: str
  ) -> PartitionSpec:
    """Like `spec`, but fails if a sharded dimension is not divisible by its mesh axes, and
    applies ``fallback`` to an array that no rule splits.

    Fewer names than dimensions name the leading ones; the rest are replicated (`padded`).

    In a table with a ``fallback`` (FSDP's), its own rules are preferences: a dimension that
    its rule's mesh axes do not divide is left whole, as if unnamed, so that the fallback then
    splits the largest dimension it divides (`relaxed` names such dimensions). A rule given by
    `overlay` is the user's word and is never set aside: it fails, and the error says how to
    fix it.

    Example::

      rules = LogicalRules.of({'heads': 'model'})
      rules.checked_spec(('embed', 'heads'), (16, 4, 8), mesh_4x2, "parameter 'key/kernel'")
      # PartitionSpec(None, 'model', None)
      fsdp = LogicalRules.of({'embed': ('data', 'model')}, fallback=('data', 'model'))
      fsdp.checked_spec(('mlp', 'embed'), (128, 10), mesh_2x2, "parameter 'w2'")
      # PartitionSpec(('data', 'model'), None): 4 does not divide 'embed''s 10, but 128

    Args:
      names: logical name of each dimension (``None`` for an unnamed dimension); may be
        shorter than ``shape``.
      shape: the array's shape.
      mesh: the mesh the array will live on.
      what: how to name the array in an error, e.g. ``"parameter 'tower/kernel'"``.

    Raises:
      ShardingError: one line naming the array, the dimension and the sizes (and the rule's
        source, `overlay`, with the rule that replicates it and the dimensions that would
        divide), or more names than dimensions.
    """
    return self._resolve(names, shape, mesh, what)[0]

  def relaxed(self, names: Sequence[str | None], shape: Sequence[int], mesh: Mesh
              ) -> tuple[int, ...]:
    """The dimensions whose rule `checked_spec` set aside because its mesh axes do not divide
    them (only in a table with a ``fallback``), in order; ``()`` for most arrays.

    Example: FSDP's table on 4 devices, ``('mlp', 'embed')`` of shape ``(128, 10)``: ``(1,)``.
    """
    return self._resolve(names, shape, mesh, 'array')[1]

  def _resolve(self, names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, what: str
               ) -> tuple[PartitionSpec, tuple[int, ...]]:
    """(`checked_spec`, `relaxed`): resolves the rules, setting aside in turn each rule that a
    fallback table may set aside and that does not divide its dimension (its mesh axes are then
    free for the array's other dimensions), until every split divides."""
    if len(names) > len(shape):
      raise ShardingError(
          f'{what}: {len(names)} logical names {tuple(names)} for a rank-{len(shape)} array (at '
          'most one a dimension; fewer leave the trailing dimensions replicated)')
    names = padded(names, len(shape))
    missing = [a for a in self.fallback if a not in mesh.shape]
    if missing:
      raise ShardingError(
          f'{what}: the fallback maps onto mesh axis {missing[0]!r}, which mesh '
          f'{dict(mesh.shape)} lacks')
    relaxed: list[int] = []
    while True:
      kept = tuple(None if dim in relaxed else name for dim, name in enumerate(names))
      axes_of = self.mesh_axes(kept)
      for dim, (name, axes) in enumerate(zip(kept, axes_of, strict=True)):
        missing = [a for a in axes if a not in mesh.shape]
        if missing:
          raise ShardingError(
              f'{what}: dimension {dim} ({name!r}) maps onto mesh axis {missing[0]!r}, which '
              f'mesh {dict(mesh.shape)} lacks{self._source(name, axes)}')
      bad = next((dim for dim, (size, axes) in enumerate(zip(shape, axes_of, strict=True))
                  if size % math.prod(mesh.shape[a] for a in axes)), None)
      if bad is None:
        break
      if (self.fallback or kept[bad] in self.optional) and not self._source(kept[bad],
                                                                              axes_of[bad]):
        relaxed.append(bad)
        continue
      raise ShardingError(self._indivisible(what, kept, shape, axes_of, bad, mesh))
    spec = self.spec(kept)
    if self.fallback and all(entry is None for entry in spec):
      given = dict(self.sources)
      whole = {dim for dim, name in enumerate(kept) if name in given and not axes_of[dim]}
      spec = self._fallback_spec(shape, mesh, whole)
    return spec, tuple(relaxed)

  def _indivisible(self, what: str, names: Sequence[str | None], shape: Sequence[int],
                   axes_of: Sequence[MeshAxes], dim: int, mesh: Mesh) -> str:
    """The one-line error for dimension ``dim`` that its mesh axes do not divide: the sizes,
    the rule's source, and the fixes: the rule that replicates it, the dimensions the same
    devices divide.

    Example::

      parameter 'w2': dimension 1 ('embed', size 10) is not divisible by mesh axes ('data',
      'model') of total size 4 (parallelism.rules['embed']); replicate it with
      parallelism.rules.embed=None, or split dimension 0 ('mlp', size 128), which 4 divides
    """
    name, axes = names[dim], axes_of[dim]
    ways = math.prod(mesh.shape[a] for a in axes)
    source = dict(self.sources).get(name) if self._source(name, axes) else None
    fixes = [f'replicate it with {source}.{name}=None'] if source else []
    divisible = [f'dimension {d} ({names[d]!r}, size {size})' for d, size in enumerate(shape)
                 if d != dim and size % ways == 0 and not axes_of[d]]
    if divisible:
      fixes.append(f'split {" or ".join(divisible)}, which {ways} divides')
    return (f'{what}: dimension {dim} ({name!r}, size {shape[dim]}) is not divisible by mesh axes '
            f'{axes} of total size {ways}{self._source(name, axes)}'
            + (f'; {", or ".join(fixes)}' if fixes else ''))

  def _source(self, name: str | None, axes: MeshAxes) -> str:
    """`` (parallelism.rules['kv'])`` when ``axes`` came from the first rule of ``name``,
    given by `overlay` with that source; else empty."""
    source = dict(self.sources).get(name) if name is not None else None
    first = next((a for n, a in self.rules if n == name), None)
    return f' ({source}[{name!r}])' if source and first == axes else ''

  def _fallback_spec(self, shape: Sequence[int], mesh: Mesh, whole: set[int]) -> PartitionSpec:
    """``fallback`` on the largest dimension it divides (the first of equal ones) outside
    ``whole``; replicated when it divides none, or when its axes have one device (nothing to
    split)."""
    ways = math.prod(mesh.shape[a] for a in self.fallback)
    divisible = [dim for dim, size in enumerate(shape)
                 if size % ways == 0 and dim not in whole] if ways > 1 else []
    entries: list[str | MeshAxes | None] = [None] * len(shape)
    if divisible:
      dim = max(divisible, key=lambda d: (shape[d], -d))
      entries[dim] = self.fallback[0] if len(self.fallback) == 1 else self.fallback
    return PartitionSpec(*entries)


@dataclasses.dataclass(frozen=True)
class ShardingRules:
  """Where parameters live and where compute runs, as two rule tables.

  Following Levanter's ``parameter_axis_mapping`` / ``compute_axis_mapping``: FSDP, for
  example, stores ``'embed'`` split over every device but computes with the batch split instead.

  Attributes:
    params: rules for parameters and optimizer state.
    compute: rules for the batch and for activation constraints inside the model.
  """

  params: LogicalRules
  compute: LogicalRules

  def overlay(self, mapping: Mapping[str, str | Sequence[str] | None], source: str = ''
              ) -> ShardingRules:
    """Both tables with ``mapping``'s rules first (`LogicalRules.overlay`): a name given there
    lives and computes as it says.

    Example::

      >>> rules = ShardingRules(LogicalRules.of({'heads': 'model'}),
      ...                       LogicalRules.of({'batch': 'data', 'heads': 'model'}))
      >>> rules.overlay({'heads': None}).params.spec(('embed', 'heads'))
      PartitionSpec(None, None)
    """
    return ShardingRules(self.params.overlay(mapping, source),
                         self.compute.overlay(mapping, source))
