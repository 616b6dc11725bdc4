"""Structural checks on jaxprs: how many loops a program runs at the outer level, callbacks."""

import jax


def _subjaxprs(eqn):
    for value in eqn.params.values():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def outer_while_loops(jaxpr) -> int:
    """Number of while loops not nested inside another while loop (scans and inner loops of a
    loop body are not counted)."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            count += 1
        else:
            count += sum(outer_while_loops(sub) for sub in _subjaxprs(eqn))
    return count


def primitive_names(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in _subjaxprs(eqn):
            names |= primitive_names(sub)
    return names


def dot_operand_dtypes(jaxpr) -> set[str]:
    """The operand dtypes of every dot_general in the program, nested ones included."""
    dtypes = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            dtypes |= {str(v.aval.dtype) for v in eqn.invars}
        for sub in _subjaxprs(eqn):
            dtypes |= dot_operand_dtypes(sub)
    return dtypes


def assert_one_loop_no_callbacks(closed_jaxpr) -> None:
    jaxpr = closed_jaxpr.jaxpr
    assert outer_while_loops(jaxpr) == 1, outer_while_loops(jaxpr)
    callbacks = {n for n in primitive_names(jaxpr) if "callback" in n}
    assert not callbacks, callbacks


def stack_slices(jaxpr, n_layers: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(operand shape, result shape) of every static `slice` that cuts fewer than n_layers
    entries out of an array stacked over n_layers (leading axis), anywhere in the program: a
    copy of that part of the stack on every call."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "slice":
            shape, out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
            if len(shape) >= 2 and shape[0] == n_layers and out[0] < n_layers:
                found.append((tuple(shape), tuple(out)))
        for sub in _subjaxprs(eqn):
            found += stack_slices(sub, n_layers)
    return found


def indexed_matrix_stacks(jaxpr, n_layers: int) -> list[tuple[int, ...]]:
    """Operand shapes of every `dynamic_slice` that takes one layer out of a stack of matrices
    ([n_layers, a, b]) anywhere in the program: on XLA:CPU a copy of that layer's weights
    before the product reads them."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dynamic_slice":
            shape = eqn.invars[0].aval.shape
            if len(shape) == 3 and shape[0] == n_layers:
                found.append(tuple(shape))
        for sub in _subjaxprs(eqn):
            found += indexed_matrix_stacks(sub, n_layers)
    return found
