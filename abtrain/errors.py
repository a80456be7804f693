"""The error every part raises for a config that can't be run (a key, a value, a model the
config names), apart from the config's own schema so that the model builders can raise it
too without importing the config."""


class ConfigError(ValueError):
    """A config that can't be run; the message names the key."""
