"""attn_course: the helper package of *Attention from Scratch*.

Reference implementations of everything the notebooks build (tested against PyTorch's own),
one check per exercise (``attn_course.checks``), plots and widgets, timing tools, and the course
tooling behind ``python -m attn_course`` (exercise generation, grading, budgets, benchmarks).

Modules are imported on demand, so ``import attn_course`` stays cheap.
"""

__version__ = "0.1.0"
