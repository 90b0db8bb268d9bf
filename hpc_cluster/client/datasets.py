"""Published datasets, as dask.distributed's: `client.publish_dataset`, `get_dataset`,
`list_datasets`, `unpublish_dataset` and `client.datasets[...]`, a MutableMapping over them.
Mixed into Client (client/client.py).

The scheduler keeps a dataset as opaque bytes with the keys of the futures inside it (a persisted
collection's), and keeps those results while it is published (scheduler/coordination.py), so
another client can take it up by name; the journal keeps it across a scheduler restart.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from .sharing import answer, ask, pack, unpack
from ..protocol.messages import Op

_NO_DEFAULT = object()


def _key(name):
    """A dataset's name as dask keys are (msgpack brings a tuple back as a list)."""
    return tuple(_key(n) for n in name) if isinstance(name, list) else name


def _check_name(name) -> None:
    if isinstance(name, tuple):
        for part in name:
            _check_name(part)
    elif not isinstance(name, (str, int, float)) or isinstance(name, bool):
        raise TypeError(f"a dataset's name is a dask key (a string, a number, or a tuple of those), not "
                        f"{type(name).__name__} {name!r}")


def _sync_keywords(kwargs: dict, what: str) -> None:
    """distributed's methods pass these on to its sync(); the client's own timeout applies here."""
    unknown = set(kwargs) - {"asynchronous", "callback_timeout"}
    if unknown:
        raise TypeError(f"{what}() got unexpected keyword arguments {sorted(unknown)}")


class DatasetsMixin:
    @property
    def datasets(self) -> "Datasets":
        """The published datasets as a mapping: `client.datasets['name']`, `= value`, `del`, `in`, `len`."""
        return Datasets(self)

    def publish_dataset(self, *args, name=None, override: bool = False, **kwargs):
        """Publish named collections or futures: `publish_dataset(df, name='x')`,
        `publish_dataset(x=df, y=f)` or `publish_dataset({'x': df})`. Persist a collection first:
        what is published is kept as it is (its futures' results kept too) for any client to
        `get_dataset`. KeyError if a name is taken, unless override=True."""
        names, values = list(kwargs), list(kwargs.values())
        if name is not None:
            if not args:
                raise ValueError("If name is provided, expecting call signature like publish_dataset(df, name='ds')")
            names.append(name)
            values.append(args[0] if len(args) == 1 else args)
        elif args:
            if len(args) != 1 or not isinstance(args[0], Mapping):
                raise ValueError("If name is omitted, positional argument must be a {name: value} dict")
            names.extend(args[0])
            values.extend(args[0].values())
        for n in names:
            _check_name(n)
        msg = {"op": Op.DATASET_PUT, "names": names, "override": bool(override),
               "values": [pack(v, f"dataset {n!r}") for n, v in zip(names, values)]}
        return ask(self, msg)

    def unpublish_dataset(self, name, **kwargs):
        """Remove the named dataset(s) (a name, or a list of names) from the scheduler."""
        _sync_keywords(kwargs, "unpublish_dataset")
        return ask(self, {"op": Op.DATASET_DELETE, "names": name if isinstance(name, list) else [name]})

    def list_datasets(self, **kwargs):
        """The names of the published datasets."""
        _sync_keywords(kwargs, "list_datasets")
        return ask(self, {"op": Op.DATASET_LIST}, then=lambda r: [_key(n) for n in answer(r)])

    def get_dataset(self, name, default=_NO_DEFAULT, **kwargs):
        """The named dataset (a list of names: a list of them), its futures this client's.
        KeyError if it is not published, unless a `default` is given."""
        _sync_keywords(kwargs, "get_dataset")
        names = name if isinstance(name, list) else [name]

        def then(result):
            out = []
            for wire in answer(result):
                if wire is None:
                    if default is _NO_DEFAULT:
                        raise KeyError(f"Dataset '{name}' not found")
                    out.append(default)
                else:
                    out.append(unpack(self, wire))
            return out if isinstance(name, list) else out[0]
        return ask(self, {"op": Op.DATASET_GET, "names": names}, then=then)


class Datasets(MutableMapping):
    """A dict-like view of a client's published datasets (distributed's `client.datasets`)."""

    __slots__ = ("_client",)

    def __init__(self, client):
        self._client = client

    def __getitem__(self, key):
        return self._client.get_dataset(key)

    def __setitem__(self, key, value):
        if getattr(self._client, "asynchronous", False):
            raise TypeError("Can't use 'client.datasets[name] = value' when client is asynchronous; "
                            "please use 'client.publish_dataset(name=value)' instead")
        self._client.publish_dataset(value, name=key)

    def __delitem__(self, key):
        if getattr(self._client, "asynchronous", False):
            raise TypeError("Can't use 'del client.datasets[name]' when client is asynchronous; "
                            "please use 'client.unpublish_dataset(name)' instead")
        self._client.unpublish_dataset(key)

    def __contains__(self, key):
        return key in self._client.list_datasets()

    def __iter__(self):
        if getattr(self._client, "asynchronous", False):
            raise TypeError("Can't invoke iter() or 'for' on client.datasets when client is "
                            "asynchronous; use 'async for' instead")
        yield from self._client.list_datasets()

    def __aiter__(self):
        if not getattr(self._client, "asynchronous", False):
            raise TypeError("Can't invoke 'async for' on client.datasets when client is synchronous; "
                            "use iter() or 'for' instead")

        async def names():
            for key in await self._client.list_datasets():
                yield key
        return names()

    def __len__(self):
        if getattr(self._client, "asynchronous", False):
            raise TypeError("Can't use 'len(client.datasets)' when client is asynchronous; "
                            "please use 'len(await client.list_datasets())' instead")
        return len(self._client.list_datasets())
