"""Configuration: the settings table, site config files, HPC_CLUSTER_* variables, keyword
arguments, and (jobqueue.py) dask-jobqueue's configuration.

    schema.py    every setting: name, kind, validator, default, help (one table)
    adapter_options.py   the installed adapters' own settings and rules, joined to the table
    files.py     finding and reading site config files (YAML that remembers its lines)
    resolve.py   merging keywords > env > files > defaults into one ResolvedConfig

Import from here; the modules are the rooms, this is the door.
"""

from .files import (CONFIG_FILENAME, CWD_FILENAME, SYSTEM_CONFIG_DIR, Candidate, ConfigFile, Entry,
                    candidate_paths, find_config_files, load_config_files, load_yaml,
                    parse_config_text, system_config_dir, user_config_dir)
from .resolve import (ENV_PREFIX, ResolvedConfig, check_keywords, env_overrides, merge, resolve,
                      select_site, starter_config)
from .schema import (ConfigError, Option, aliases, canonical_key, default_values, did_you_mean, option_by_name,
                     options, options_markdown, parse_value, settings_names)


def __getattr__(name: str):
    # OPTIONS, OPTION_BY_NAME, ALIASES, SETTINGS_NAMES: the table with the installed adapters'
    # settings, built on first use (schema.py), not when config is imported.
    from . import schema
    return getattr(schema, name)


__all__ = [
    "ALIASES", "CONFIG_FILENAME", "CWD_FILENAME", "Candidate", "ConfigError", "ConfigFile", "ENV_PREFIX",
    "Entry", "OPTIONS", "OPTION_BY_NAME", "Option", "ResolvedConfig", "SETTINGS_NAMES",
    "SYSTEM_CONFIG_DIR", "candidate_paths", "canonical_key", "check_keywords", "default_values",
    "did_you_mean", "env_overrides", "find_config_files", "load_config_files", "load_yaml", "merge",
    "aliases", "option_by_name", "options", "options_markdown", "parse_config_text", "parse_value", "resolve",
    "select_site", "settings_names",
    "starter_config", "system_config_dir", "user_config_dir",
]
