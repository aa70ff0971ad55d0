"""One check per exercise, one module per notebook (``attn_course.checks.<topic>``: a module, or a package of
modules of at most 600 lines once its checks outgrow one file).

The parts every check shares:

* :mod:`.result` — the verdict as data (:class:`~.result.CheckResult`) and how a notebook shows it;
* :mod:`.boundary` — the learner boundary: the only way a check reaches the learner's code (and the
  record / replay that lets the grader decide in a process of its own);
* :mod:`.compare` — turning answers into tensors, comparing them with the oracle, naming mistakes;
* :mod:`.exceptions` — what the errors learners' tensor code raises most often mean;
* :mod:`.core` — the :func:`~.core.check` decorator and the API check modules import.
"""
