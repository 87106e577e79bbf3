"""Compiling a test's costly program with LLVM's optimisation passes."""


def optimised(program, *args):
    """The jitted `program` compiled for `args` at XLA:CPU's backend optimisation level 1,
    where the suite compiles at 0 (tests/conftest.py): the same HLO, code that runs 3-4
    times faster for a compile about twice as long. For a program a test runs many
    times. Its results equal level 0's to the bit (measured: the exact-dropout logits of
    test_control_variate.py, full-batch sage_pool gradients) or within float32 rounding,
    where LLVM orders a reduction's adds otherwise (1e-7 relative, the control-variate
    forward): far inside the bounds of the tests that use it."""
    return program.lower(*args).compile(
        compiler_options={"xla_backend_optimization_level": 1})
