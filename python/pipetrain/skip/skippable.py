"""Skippable modules: layers that stash a tensor under a name and later layers that pop it.

    @skippable(stash=['1to3'])
    class Layer1(nn.Module):
        def forward(self, input):
            yield stash('1to3', input)
            return f1(input)

    @skippable(pop=['1to3'])
    class Layer3(nn.Module):
        def forward(self, input):
            skip = yield pop('1to3')
            return f3(input) + skip

A skippable's forward is a generator: ``yield stash(name, tensor)`` keeps a tensor (or None, an
optional skip), ``yield pop(name)`` returns it. Under pipetrain's GPipe and engine the stashed
tensor travels straight from the stashing partition or stage to the popping one; in a plain
nn.Sequential it waits on the calling thread. The tensors live in the native runtime's skip
tracker, so the same module runs unchanged in both.
"""
import types

from torch import nn

from .. import _C
from ..errors import ModuleError
from .namespace import Namespace, default_namespace

__all__ = ['skippable', 'stash', 'pop', 'Skippable', 'verify_skippables']


class stash:  # noqa: N801 - torchgpipe's spelling, so code written for it runs as it is
    """``yield stash(name, tensor)`` in a skippable's forward keeps ``tensor`` under ``name``."""

    __slots__ = ('name', 'tensor')

    def __init__(self, name, tensor):
        self.name = name
        self.tensor = tensor


class pop:  # noqa: N801
    """``tensor = yield pop(name)`` in a skippable's forward takes what was stashed under ``name``."""

    __slots__ = ('name',)

    def __init__(self, name):
        self.name = name


class Skippable(nn.Module):
    """A module made by :func:`skippable`: it holds the decorated module as ``self.module``."""

    module_cls = None
    stashable_names = frozenset()
    poppable_names = frozenset()

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.module = self.module_cls(*args, **kwargs)
        self.namespaces = {}

    def __repr__(self):
        return f'@skippable({self.module})'

    def namespaced(self, name):
        """(namespace name, skip name): the key the name is stashed or popped under."""
        return (self.namespaces.get(name, default_namespace).name, name)

    def stashable(self):
        for name in sorted(self.stashable_names):
            yield self.namespaces.get(name, default_namespace), name

    def poppable(self):
        for name in sorted(self.poppable_names):
            yield self.namespaces.get(name, default_namespace), name

    def isolate(self, ns, *, only=None):
        """Moves this layer's names (or only those in ``only``) into namespace ``ns``; returns self."""
        if not isinstance(ns, Namespace):
            raise TypeError(f'isolate takes a pipetrain.skip.Namespace, got {type(ns).__name__}')
        names = self.stashable_names | self.poppable_names
        if isinstance(only, str):
            only = [only]  # one name (torchgpipe's docstring writes only='alice')
        if only is not None:
            unknown = sorted(set(only) - names)
            if unknown:
                raise ValueError(f'{type(self).__name__} declares no skip named {unknown}; '
                                 f'its names are {sorted(names)}')
            names = frozenset(only)
        for name in names:
            self.namespaces[name] = ns
        return self

    def skip_keys(self):
        """(stash keys, pop keys), each a sorted list of (namespace name, skip name): the one
        order in which a skippable's names are handed to the native runtime."""
        return ([self.namespaced(n) for n in sorted(self.stashable_names)],
                [self.namespaced(n) for n in sorted(self.poppable_names)])

    def forward(self, input):  # pylint: disable=redefined-builtin
        output = self.module(input)
        stashed, popped = set(), set()
        if not isinstance(output, types.GeneratorType):
            self._check_all_used(stashed, popped)  # a forward without a yield: only if it declares nothing
            return output
        sent = None
        while True:
            try:
                request = output.send(sent)
            except StopIteration as done:
                self._check_all_used(stashed, popped)
                return done.value
            if isinstance(request, stash):
                self._check(request.name, self.stashable_names, 'stash')
                _C.skip_stash(*self.namespaced(request.name), request.tensor)
                stashed.add(request.name)
                sent = None
            elif isinstance(request, pop):
                self._check(request.name, self.poppable_names, 'pop')
                sent = _C.skip_pop(*self.namespaced(request.name))
                popped.add(request.name)
            else:
                raise TypeError(f'{type(self.module).__name__}.forward yielded a {type(request).__name__}; a skippable '
                                'yields only stash(name, tensor) or pop(name)')

    def _check(self, name, declared, verb):
        if name not in declared:
            raise ModuleError(f"{type(self).__name__} tried to {verb} '{name}', which it did not declare; "
                              f"add it to @skippable({verb}=[...]) (declared: {sorted(declared)})")

    def _check_all_used(self, stashed, popped):
        """torchgpipe's rule: each forward stashes every declared stash and pops every declared pop."""
        not_stashed = sorted(self.stashable_names - stashed)
        if not_stashed:
            names = ', '.join(f"'{n}'" for n in not_stashed)
            raise ModuleError(f'{names} must be stashed but have not: {type(self).__name__} declares '
                              f'@skippable(stash={sorted(self.stashable_names)}) but its forward did not yield '
                              f'stash(name, tensor) for them; stash each declared name in every forward (None for an '
                              'optional skip) or drop it from the declaration')
        not_popped = sorted(self.poppable_names - popped)
        if not_popped:
            for name in not_popped:  # nobody will take them: they must not wait for the next forward
                if _C.skip_contains(*self.namespaced(name)):
                    _C.skip_pop(*self.namespaced(name))
            names = ', '.join(f"'{n}'" for n in not_popped)
            raise ModuleError(f'{names} must be popped but have not: {type(self).__name__} declares '
                              f'@skippable(pop={sorted(self.poppable_names)}) but its forward did not yield pop(name) '
                              'for them; pop each declared name in every forward or drop it from the declaration')


def skippable(stash=(), pop=()):  # pylint: disable=redefined-outer-name
    """Class decorator: the module's forward may ``yield stash(...)`` and ``yield pop(...)``
    for the names listed here."""
    stash_names = frozenset(stash)
    pop_names = frozenset(pop)
    for what, names in (('stash', stash_names), ('pop', pop_names)):
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f'skippable({what}=...) takes names (str), got {type(name).__name__}')

    def make(module_cls):
        cls = type(module_cls.__name__, (Skippable,), {
            'module_cls': module_cls, 'stashable_names': stash_names, 'poppable_names': pop_names,
            '__module__': module_cls.__module__, '__qualname__': module_cls.__qualname__,
            '__doc__': module_cls.__doc__,
        })
        return cls
    return make


def verify_skippables(module):
    """Checks the skips of an nn.Sequential before it runs: each popped name stashed earlier,
    each stashed name popped, no name declared twice in one namespace, no layer that stashes
    and pops one name. TypeError listing every mismatch."""
    stashed, popped, problems = set(), set(), []
    for layer_name, layer in module.named_children():
        if not isinstance(layer, Skippable):
            continue
        for name in sorted(layer.stashable_names & layer.poppable_names):
            problems.append(f"'{layer_name}' declared '{name}' both as stashable and as poppable")
        for ns, name in layer.stashable():
            if name in layer.poppable_names:
                continue
            if (ns, name) in stashed:
                problems.append(f"'{layer_name}' redeclared '{name}' as stashable but not isolated by namespace")
                continue
            stashed.add((ns, name))
        for ns, name in layer.poppable():
            if name in layer.stashable_names:
                continue
            if (ns, name) in popped:
                problems.append(f"'{layer_name}' redeclared '{name}' as poppable but not isolated by namespace")
                continue
            if (ns, name) not in stashed:
                problems.append(f"'{layer_name}' declared '{name}' as poppable but it was not stashed")
                continue
            popped.add((ns, name))
    for _, name in sorted(stashed - popped, key=lambda k: (k[0].name, k[1])):
        problems.append(f"no module declared '{name}' as poppable but stashed")
    if problems:
        raise TypeError('one or more pairs of stash and pop do not match:\n\n'
                        + '\n'.join(f'* {p}' for p in problems))
