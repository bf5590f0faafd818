"""The run report: verdict, accuracy, training curves, speed and provenance.

``vaecf.report.build.write`` renders ``report.md``, a self-contained ``report.html`` and
``report.json`` from any subset of the inputs read by ``vaecf.report.inputs.load_inputs``.
"""
