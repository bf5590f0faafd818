"""KFP v2 components: each maps KFP inputs and outputs to the flags of one ``vaecf`` stage.

Only the standard library, ``kfp`` and ``kfp.kubernetes`` are imported here (STYLE rule 2):
compiling the pipeline needs nothing else.
"""
