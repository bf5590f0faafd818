"""The vaecf KFP pipeline and its compile entry point (stdlib + kfp imports only)."""
