"""Namespaces for skip names, so copies of one block can stash and pop the same names."""
import itertools

__all__ = ['Namespace']

_created = itertools.count(1)


class Namespace:
    """A scope for skip names.

    Names are numbered in creation order, so ranks that build their model description the same
    way agree on them (the engine routes skips between processes by name). A copy of a namespace
    (``copy.deepcopy`` of a model) is the same namespace.
    """

    __slots__ = ('name',)

    def __init__(self):
        self.name = f'ns{next(_created)}'

    def __repr__(self):
        return f'<Namespace {self.name}>'

    def __eq__(self, other):
        return isinstance(other, Namespace) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __lt__(self, other):
        return self.name < other.name


class _DefaultNamespace(Namespace):
    __slots__ = ()

    def __init__(self):  # pylint: disable=super-init-not-called
        self.name = ''

    def __repr__(self):
        return '<default Namespace>'


default_namespace = _DefaultNamespace()
