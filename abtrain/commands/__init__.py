"""`python -m abtrain` and `python -m abtrain.launch`: the commands over the library."""
