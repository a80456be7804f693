"""The reproduction pipeline's stages: thin scripts over abtrain and search, run by DVC."""
