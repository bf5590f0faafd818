"""Training: input pipeline, Horovod wiring, mixed precision, checkpoints, loop and export.

Nothing is imported here: ``vaecf.train.run.train`` is the entry point, and importing this
package must not pull in TensorFlow (the benchmark stage lives here too and stays light).
"""
