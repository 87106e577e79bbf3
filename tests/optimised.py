"""Compiling a test's costly program with LLVM's optimisation passes."""


def optimised(program, *args):
    """The jitted `program` compiled for `args` at XLA:CPU's backend optimisation level 1,
    where the suite compiles at 0 (tests/conftest.py): the same HLO and arithmetic, the
    same results to the bit (checked on the programs that use it), code that runs 3-4
    times faster for a compile about twice as long. For a program a test runs many
    times, or once over much data."""
    return program.lower(*args).compile(
        compiler_options={"xla_backend_optimization_level": 1})
