"""``torch.distributed.device_mesh`` on MPI: an n-dimensional grid of ranks with one process
group per mesh dimension.

A mesh of shape ``(2, 2)`` named ``("dp", "tp")`` over four ranks::

            tp=0  tp=1
    dp=0  [  0,    1  ]      rank 2 is at coordinate (1, 0); its "tp" group is {2, 3},
    dp=1  [  2,    3  ]      its "dp" group is {0, 2}.

The groups of every dimension are made once, when the mesh is built (an MPI
sub-communicator per row of each dimension, through :func:`split_group`), collectively and
in the same order on every rank. Slicing a mesh (``mesh["tp"]``) reuses them: it never
communicates. Building a mesh checks, with one collective over the world, that every rank
passed the same device type, the same grid and the same names.

Example:
    >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    >>> tp = mesh["tp"]
    >>> dist.all_reduce(t, group=tp.get_group())
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import distributed as _dist
from ..tensor import Tensor

__all__ = ["DeviceMesh", "init_device_mesh"]

_DEVICE_TYPES = ("cpu", "cuda")
DimSpec = Union[int, str]


def _as_grid(mesh: Any) -> np.ndarray:
    """The mesh argument as a NumPy int64 array of global ranks (Tensor, array or nested list)."""
    if isinstance(mesh, DeviceMesh):
        return mesh._grid.copy()
    data = mesh._data if isinstance(mesh, Tensor) else mesh
    if hasattr(data, "get") and not isinstance(data, (np.ndarray, dict)):
        data = data.get()  # a CuPy array: the grid lives on the host
    try:
        grid = np.array(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"DeviceMesh: mesh must be a grid of ints, got {mesh!r}") from exc
    if grid.dtype.kind not in "iu":
        raise TypeError(f"DeviceMesh: mesh must hold integer ranks, got dtype {grid.dtype} "
                        f"({mesh!r})")
    if grid.ndim == 0:
        grid = grid.reshape(1)
    return grid.astype(np.int64)


def _check_grid(grid: np.ndarray, names: Optional[Tuple[str, ...]], world: int,
                device_type: str) -> None:
    """Reject a bad mesh argument before any collective (same checks on every rank)."""
    if device_type not in _DEVICE_TYPES:
        raise ValueError(f"DeviceMesh: device_type {device_type!r} is not one of "
                         f"{_DEVICE_TYPES}")
    if grid.size == 0:
        raise ValueError(f"DeviceMesh: the mesh {grid.tolist()} holds no rank")
    flat = grid.ravel().tolist()
    bad = [r for r in flat if not 0 <= r < world]
    if bad:
        raise ValueError(f"DeviceMesh: ranks {bad} of the mesh {grid.tolist()} are outside "
                         f"the world (size {world}); start more ranks or shrink the mesh")
    if len(set(flat)) != len(flat):
        raise ValueError(f"DeviceMesh: the mesh {grid.tolist()} names a rank twice")
    for d in range(grid.ndim):
        lines = _rows(grid, d)
        odd = next((line for line in lines if line != sorted(line)), None)
        if odd is not None:
            raise ValueError(f"DeviceMesh: the ranks {odd} along mesh dim {d} of "
                             f"{grid.tolist()} are not in increasing order; a group numbers "
                             "its members by global rank, so list them in that order")
    if names is not None:
        if len(names) != grid.ndim:
            raise ValueError(f"DeviceMesh: {len(names)} mesh_dim_names {names} for a mesh of "
                             f"{grid.ndim} dimensions (shape {tuple(grid.shape)})")
        if len(set(names)) != len(names):
            raise ValueError(f"DeviceMesh: mesh_dim_names {names} repeat a name")
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"DeviceMesh: mesh_dim_names must be strings, got {names}")


def _rows(grid: np.ndarray, dim: int) -> List[List[int]]:
    """The groups of mesh dimension ``dim``: every line of ranks along it, in a fixed order."""
    return np.moveaxis(grid, dim, -1).reshape(-1, grid.shape[dim]).tolist()


def _check_same_everywhere(device_type: str, grid: np.ndarray,
                           names: Optional[Tuple[str, ...]], bad: Optional[str]) -> None:
    """One all-gather of every rank's mesh arguments; any difference fails every rank."""
    mine = (device_type, grid.tolist(), names, bad)
    seen: List[Any] = [None] * _dist.get_world_size()
    _dist.all_gather_object(seen, mine)
    odd = [r for r, other in enumerate(seen) if other != seen[0]]
    if odd:
        raise ValueError(
            f"DeviceMesh: the ranks built different meshes: rank 0 passed {seen[0][:3]!r} "
            f"but rank(s) {odd} passed {[seen[r][:3] for r in odd]!r} (this is rank "
            f"{_dist.get_rank()}); build the same mesh on every rank")


class DeviceMesh:
    """An n-dimensional grid of global ranks, with one process group per dimension.

    Args:
        device_type: ``"cpu"`` (NumPy) or ``"cuda"`` (CuPy).
        mesh: the grid of global ranks (nested list, NumPy array or Tensor).
        mesh_dim_names: one name per dimension, for slicing and ``get_group("tp")``.
        backend_override: accepted for torch's signature; the world's backend is used.

    Every rank of the world must build the same mesh, in the same order as its other meshes
    and groups; a rank outside the grid gets a mesh whose ``get_coordinate()`` is None.

    Raises:
        ValueError: a bad device type, ranks outside the world, a rank named twice, names
            that do not fit the grid, or (on every rank) a mesh that differs across ranks.

    Example:
        >>> mesh = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        >>> mesh.get_local_rank("tp"), mesh.size()
        (1, 4)                      # on rank 3
    """

    def __init__(self, device_type: str, mesh: Any, *,
                 mesh_dim_names: Optional[Sequence[str]] = None,
                 backend_override: Any = None, _init_backend: bool = True,
                 _bad: Optional[Exception] = None) -> None:
        if not _dist.is_initialized():
            _dist.init_process_group("mpi")
        names = None if mesh_dim_names is None else tuple(mesh_dim_names)
        try:
            grid, bad = _as_grid(mesh), _bad
        except TypeError as exc:
            grid, bad = np.zeros(0, np.int64), exc
        # agree first, so that a rank with odd arguments fails with the others, not alone
        _check_same_everywhere(device_type, grid, names, repr(bad) if bad else None)
        if bad is not None:
            raise bad
        _check_grid(grid, names, _dist.get_world_size(), device_type)
        self._setup(device_type, grid, names, _dist.get_rank())
        self._groups = self._make_groups() if _init_backend else [None] * grid.ndim

    def _setup(self, device_type: str, grid: np.ndarray, names: Optional[Tuple[str, ...]],
               rank: int) -> None:
        self.device_type = device_type
        self._grid = grid
        self._names = names
        self._rank = rank
        where = np.argwhere(grid == rank)
        self._coord = None if len(where) == 0 else [int(c) for c in where[0]]
        # a mesh is its own root until sliced from one: _rd[d] is the root's dims that this
        # mesh's dim d spans (one, or several after _flatten); the root keeps the flattened
        # names (name -> root dims, and their groups), which every slice of it may ask for
        self._root, self._rd = self, tuple((d,) for d in range(grid.ndim))
        self._flat: Dict[str, Tuple[Tuple[int, ...], Any]] = {}

    def _make_groups(self) -> List[Any]:
        world = _dist.get_world_size()
        groups = []
        for dim in range(self._grid.ndim):
            rows = _rows(self._grid, dim)
            if len(rows) == 1 and rows[0] == list(range(world)):
                groups.append(_dist.group.WORLD)  # the world in order: no new communicator
                continue
            desc = f"mesh_{self._names[dim] if self._names else dim}"
            groups.append(_dist.split_group(None, rows, group_desc=desc))
        return groups

    # ---------------------------------------------------------------- the grid
    @property
    def mesh(self) -> Tensor:
        """The grid of global ranks, as an int64 Tensor (a copy)."""
        return Tensor(self._grid.copy())

    @property
    def mesh_dim_names(self) -> Optional[Tuple[str, ...]]:
        """The names of the dimensions, or None."""
        return self._names

    @property
    def ndim(self) -> int:
        """The number of mesh dimensions."""
        return self._grid.ndim

    @property
    def shape(self) -> Tuple[int, ...]:
        """The grid's shape."""
        return tuple(self._grid.shape)

    def size(self, mesh_dim: Optional[DimSpec] = None) -> int:
        """The number of ranks in the mesh, or along ``mesh_dim`` (index or name)."""
        if mesh_dim is None:
            return int(self._grid.size)
        return int(self._grid.shape[self._dim(mesh_dim, "size")])

    def get_rank(self) -> int:
        """This process's global rank."""
        return self._rank

    def get_coordinate(self) -> Optional[List[int]]:
        """This rank's index along every mesh dimension, or None when it is not in the mesh."""
        return None if self._coord is None else list(self._coord)

    def _dim(self, mesh_dim: DimSpec, where: str) -> int:
        """A mesh dimension given by index or name, checked."""
        if isinstance(mesh_dim, str):
            if not self._names or mesh_dim not in self._names:
                raise KeyError(f"DeviceMesh.{where}: no mesh dimension named {mesh_dim!r}; "
                               f"the names are {self._names}")
            return self._names.index(mesh_dim)
        try:
            d = mesh_dim.__index__()
        except AttributeError:
            raise TypeError(f"DeviceMesh.{where}: mesh_dim must be an int or a name, got "
                            f"{mesh_dim!r}") from None
        if not -self.ndim <= d < self.ndim:
            raise IndexError(f"DeviceMesh.{where}: mesh_dim {d} is out of range for a mesh "
                             f"of {self.ndim} dimensions")
        return d % self.ndim

    def _one_dim(self, mesh_dim: Optional[DimSpec], where: str) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"DeviceMesh.{where}: this mesh has {self.ndim} dimensions "
                                   f"{self._names or ''}; pass mesh_dim (an index or a name)")
            return 0
        return self._dim(mesh_dim, where)

    # ---------------------------------------------------------------- groups
    def get_group(self, mesh_dim: Optional[DimSpec] = None) -> Any:
        """The process group of ``mesh_dim`` (required when the mesh has several dimensions).

        The group holds this rank's line of ranks along that dimension and works with every
        ``mpitensor.distributed`` collective (``group=``).

        Raises:
            RuntimeError: ``mesh_dim`` omitted on a mesh of several dimensions, or this rank is
                not in the mesh.
        """
        d = self._one_dim(mesh_dim, "get_group")
        group = self._groups[d]
        if group is None:
            raise RuntimeError(f"DeviceMesh.get_group: rank {self._rank} is not in the mesh "
                               f"{self._grid.tolist()}, so it has no group along dim {d}")
        return group

    def get_all_groups(self) -> List[Any]:
        """The process groups of every mesh dimension, in order."""
        return [self.get_group(d) for d in range(self.ndim)]

    def get_local_rank(self, mesh_dim: Optional[DimSpec] = None) -> int:
        """This rank's index along ``mesh_dim`` (its rank in that dimension's group)."""
        d = self._one_dim(mesh_dim, "get_local_rank")
        if self._coord is None:
            raise RuntimeError(f"DeviceMesh.get_local_rank: rank {self._rank} is not in the "
                               f"mesh {self._grid.tolist()}")
        return self._coord[d]

    # ---------------------------------------------------------------- slicing
    def __getitem__(self, names: Union[str, Sequence[str]]) -> "DeviceMesh":
        """The sub-mesh of the named dimensions through this rank (no communication).

        A name is one of this mesh's dimensions or a name its root mesh got from
        :meth:`_flatten` whose dimensions all lie in this mesh.

        Raises:
            KeyError: a name that is neither, or two names that share a dimension.
            RuntimeError: this rank is not in the mesh.
        """
        wanted = (names,) if isinstance(names, str) else tuple(names)
        if wanted == self._names:
            return self
        dims = [self._resolve(n, wanted) for n in wanted]
        if self._coord is None:
            raise RuntimeError(f"DeviceMesh: rank {self._rank} is not in the mesh "
                               f"{self._grid.tolist()}, so it has no sub-mesh")
        rds = [rd for rd, _ in dims]
        used = [d for rd in rds for d in rd]
        if len(set(used)) != len(used):
            raise KeyError(f"DeviceMesh: cannot slice by {wanted}: the names share a "
                           "dimension")
        sub = DeviceMesh.__new__(DeviceMesh)
        sub._setup(self.device_type, self._root._slice(rds), wanted, self._rank)
        sub._root, sub._rd, sub._groups = self._root, tuple(rds), [g for _, g in dims]
        return sub

    def _resolve(self, name: Any, wanted: Tuple[Any, ...]) -> Tuple[Tuple[int, ...], Any]:
        """(root dims, group) of the dimension ``name`` names, as seen from this mesh."""
        if self._names and name in self._names:
            d = self._names.index(name)
            return self._rd[d], self._groups[d]
        flat = self._root._flat.get(name) if isinstance(name, str) else None
        if flat is not None and set(flat[0]) <= {d for rd in self._rd for d in rd}:
            return flat
        known = list(self._names or ()) + [n for n, (rd, _) in self._root._flat.items()
                                           if set(rd) <= {d for r in self._rd for d in r}]
        raise KeyError(f"DeviceMesh: cannot slice by {wanted}: {name!r} is not a dimension of "
                       f"this mesh (its names: {tuple(known) or None})")

    def _slice(self, rds: List[Tuple[int, ...]]) -> np.ndarray:
        """This root mesh's grid through this rank along the root dims ``rds`` (one entry per
        dimension of the result; an entry of several dims is merged, in root order)."""
        used = [d for rd in rds for d in rd]
        index = tuple(slice(None) if d in used else self._coord[d] for d in range(self.ndim))
        kept = [d for d in range(self.ndim) if d in used]  # the order the index keeps them in
        grid = np.transpose(self._grid[index], [kept.index(d) for d in used])
        shape = [int(np.prod([self._grid.shape[d] for d in rd])) for rd in rds]
        return np.ascontiguousarray(grid.reshape(shape))

    def _get_root_mesh(self) -> "DeviceMesh":
        """The mesh this one was sliced from (itself for a mesh built whole)."""
        return self._root

    def _flatten(self, mesh_dim_name: Optional[str] = None,
                 backend_override: Any = None) -> "DeviceMesh":
        """This mesh's dimensions merged into one (row-major), as a 1-D mesh named
        ``mesh_dim_name`` (default: the names joined by ``_``), with its own process group.

        Collective: every rank of the world calls it, on its own slice of the same root mesh
        dimensions, in the same order as its other groups. The root mesh learns the name, so
        ``root[mesh_dim_name]`` (alone or beside other names) gives the flattened dimension;
        flattening the same dimensions under the same name again returns it without a new
        group.

        Raises:
            ValueError: the name is one of the root's dimensions, or names other dimensions.
        """
        rd = tuple(d for r in self._rd for d in r)
        name = mesh_dim_name if mesh_dim_name is not None else "_".join(
            self._names or tuple(str(d) for d in rd))
        root = self._root
        if not isinstance(name, str) or not name:
            raise TypeError(f"DeviceMesh._flatten: mesh_dim_name must be a non-empty string, "
                            f"got {mesh_dim_name!r}")
        if root._names and name in root._names and root._rd[root._names.index(name)] != rd:
            raise ValueError(f"DeviceMesh._flatten: {name!r} is already a dimension of the "
                             f"root mesh {root._names}; choose another name")
        if name in root._flat and root._flat[name][0] != rd:
            raise ValueError(f"DeviceMesh._flatten: {name!r} already names the flattened "
                             f"dimensions {root._flat[name][0]} of the root mesh, not {rd}")
        if name not in root._flat:
            if len(rd) == 1:
                group = self._groups[0]
            else:
                moved = np.moveaxis(root._grid, rd, range(root.ndim - len(rd), root.ndim))
                rows = moved.reshape(-1, int(np.prod([root._grid.shape[d] for d in rd])))
                group = _dist.split_group(None, rows.tolist(), group_desc=f"mesh_{name}")
            root._flat[name] = (rd, group)
        return root[name] if self._coord is not None else self._outside(name)

    def _outside(self, name: str) -> "DeviceMesh":
        mesh = DeviceMesh.__new__(DeviceMesh)
        mesh._setup(self.device_type, self._grid.reshape(-1), (name,), self._rank)
        mesh._root, mesh._groups = self._root, [None]
        return mesh

    def _unflatten(self, dim: DimSpec, mesh_sizes: Sequence[int],
                   mesh_dim_names: Sequence[str], backend_override: Any = None) -> "DeviceMesh":
        """This mesh with dimension ``dim`` split into ``mesh_sizes`` (row-major), named
        ``mesh_dim_names``: a new mesh whose other dimensions keep their groups.

        Collective over the world (one gather of every rank's grid, then one group per new
        dimension), called by every rank in the same order as its other groups.

        Raises:
            ValueError: sizes whose product is not the dimension's size, or names that do not
                fit (the same on every rank: they all raise).
        """
        d = self._dim(dim, "_unflatten")
        sizes, names = tuple(int(s) for s in mesh_sizes), tuple(mesh_dim_names)
        if int(np.prod(sizes)) != self._grid.shape[d] or len(sizes) != len(names):
            raise ValueError(f"DeviceMesh._unflatten: sizes {sizes} named {names} do not "
                             f"split dimension {d} of size {self._grid.shape[d]}")
        old = self._names or tuple(f"dim{i}" for i in range(self.ndim))
        new_names = old[:d] + names + old[d + 1:]
        shape = self._grid.shape[:d] + sizes + self._grid.shape[d + 1:]
        _check_grid(self._grid.reshape(shape), new_names, _dist.get_world_size(),
                    self.device_type)
        seen: List[Any] = [None] * _dist.get_world_size()
        _dist.all_gather_object(seen, self._grid.tolist())
        grids = [np.array(g, np.int64).reshape(shape) for g in
                 sorted({repr(g): g for g in seen}.values(), key=repr)]
        mesh = DeviceMesh.__new__(DeviceMesh)
        mesh._setup(self.device_type, self._grid.reshape(shape), new_names, self._rank)
        groups = list(self._groups[:d])
        for k in range(len(sizes)):
            rows = [row for g in grids for row in _rows(g, d + k)]
            groups.append(_dist.split_group(None, rows, group_desc=f"mesh_{names[k]}"))
        mesh._groups = groups + list(self._groups[d + 1:])
        return mesh

    @staticmethod
    def from_group(group: Any, device_type: str, mesh: Any = None, *,
                   mesh_dim_names: Optional[Sequence[str]] = None) -> "DeviceMesh":
        """A mesh over existing process group(s), without new communicators or communication.

        One group: a 1-D mesh of its ranks (``mesh``, if given, must list the same ranks).
        Several groups: ``mesh`` gives the grid, one group per dimension in order.

        Raises:
            ValueError: ``mesh`` missing for several groups, or a grid that does not fit them.
        """
        groups = list(group) if isinstance(group, (list, tuple)) else [group]
        names = None if mesh_dim_names is None else tuple(mesh_dim_names)
        if len(groups) == 1 and mesh is None:
            grid = np.array(_dist.get_process_group_ranks(groups[0]), np.int64)
        elif mesh is None:
            raise ValueError(f"DeviceMesh.from_group: {len(groups)} groups need mesh= (the "
                             "grid of global ranks, one dimension per group)")
        else:
            grid = _as_grid(mesh)
        if grid.ndim != len(groups):
            raise ValueError(f"DeviceMesh.from_group: a grid of {grid.ndim} dimensions "
                             f"{grid.tolist()} for {len(groups)} groups")
        _check_grid(grid, names, _dist.get_world_size(), device_type)
        out = DeviceMesh.__new__(DeviceMesh)
        out._setup(device_type, grid, names, _dist.get_rank())
        if out._coord is not None:
            for d, g in enumerate(groups):
                line = _rows(grid, d)
                mine = next(r for r in line if out._rank in r)
                if _dist.get_process_group_ranks(g) != mine:
                    raise ValueError(f"DeviceMesh.from_group: group {d} holds ranks "
                                     f"{_dist.get_process_group_ranks(g)}, but this rank's "
                                     f"line along dim {d} of {grid.tolist()} is {mine}")
        out._groups = groups
        return out

    # ---------------------------------------------------------------- identity
    def _key(self) -> Tuple[Any, ...]:
        return (self.device_type, self._grid.shape, tuple(self._grid.ravel().tolist()),
                self._names)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, DeviceMesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        names = self._names or tuple(f"dim{d}" for d in range(self.ndim))
        dims = ", ".join(f"{n}={s}" for n, s in zip(names, self._grid.shape))
        return f"DeviceMesh(({dims}), {self.device_type!r}, mesh={self._grid.tolist()})"

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("DeviceMesh holds MPI communicators and cannot be pickled; rebuild it "
                        "with init_device_mesh on the other side")


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Optional[Sequence[str]] = None,
                     backend_override: Any = None) -> DeviceMesh:
    """Build a mesh of ``mesh_shape`` over the world's ranks in order (row-major).

    Initialises the default process group (MPI) first if the program has not.

    Args:
        device_type: ``"cpu"`` or ``"cuda"``.
        mesh_shape: the grid's shape; its product must equal the world size.
        mesh_dim_names: one name per dimension.

    Raises:
        ValueError: a shape whose product is not the world size, or names that do not fit.

    Example:
        >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    """
    if not _dist.is_initialized():
        _dist.init_process_group("mpi")
    world = _dist.get_world_size()
    bad: Optional[Exception] = None
    try:
        shape = tuple(int(s.__index__()) for s in mesh_shape)
    except (AttributeError, TypeError):
        shape, bad = (world,), TypeError(f"init_device_mesh: mesh_shape must be a tuple of "
                                         f"ints, got {mesh_shape!r}")
    if bad is None and (any(s < 1 for s in shape) or int(np.prod(shape)) != world):
        bad = ValueError(f"init_device_mesh: mesh_shape {shape} holds {int(np.prod(shape))} "
                         f"ranks but the world has {world}; make the product equal "
                         "the world size")
        shape = (world,)
    # a bad shape still joins the mesh's agreement, so that every rank raises, none hangs
    grid = np.arange(world, dtype=np.int64).reshape(shape)
    return DeviceMesh(device_type, grid, mesh_dim_names=mesh_dim_names,
                      backend_override=backend_override, _bad=bad)
