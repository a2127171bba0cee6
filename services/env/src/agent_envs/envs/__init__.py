"""Text environments behind one contract (``contract``), registered by id (``registry``); one package each."""
