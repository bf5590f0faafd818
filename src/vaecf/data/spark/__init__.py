"""The Spark engine of ``vaecf preprocess`` and ``vaecf split`` (``--engine spark``).

It implements the pandas engine's protocols (``vaecf.data.preprocess``, ``vaecf.data.split``)
on Spark DataFrames, for inputs larger than one machine's memory, and writes the same files:
equal by content to the pandas engine's for the same input and seed. The split's keys are
``vaecf.data.split_keys``' own functions, called by the tasks that hold whole users
(``split_tasks``), as the pandas engine calls them; no Python function runs row by row.

Optional: needs the ``vaecf[spark]`` extra (PySpark 4.0) and Java 17. Nothing here is
imported unless ``--engine spark`` is asked for.
"""
