"""Configuration: the settings table, site config files, HPC_CLUSTER_* variables, keyword
arguments, and (jobqueue.py) dask-jobqueue's configuration.

    schema.py    every setting: name, kind, validator, default, help (one table)
    files.py     finding and reading site config files (YAML that remembers its lines)
    resolve.py   merging keywords > env > files > defaults into one ResolvedConfig

Import from here; the modules are the rooms, this is the door.
"""

from .files import (CONFIG_FILENAME, CWD_FILENAME, SYSTEM_CONFIG_DIR, Candidate, ConfigFile, Entry,
                    candidate_paths, find_config_files, load_config_files, load_yaml,
                    parse_config_text, system_config_dir, user_config_dir)
from .resolve import (ENV_PREFIX, ResolvedConfig, check_keywords, env_overrides, merge, resolve,
                      select_site, starter_config)
from .schema import (ALIASES, OPTION_BY_NAME, OPTIONS, SETTINGS_NAMES, ConfigError, Option,
                     canonical_key, default_values, did_you_mean, options_markdown, parse_value)

__all__ = [
    "ALIASES", "CONFIG_FILENAME", "CWD_FILENAME", "Candidate", "ConfigError", "ConfigFile", "ENV_PREFIX",
    "Entry", "OPTIONS", "OPTION_BY_NAME", "Option", "ResolvedConfig", "SETTINGS_NAMES",
    "SYSTEM_CONFIG_DIR", "candidate_paths", "canonical_key", "check_keywords", "default_values",
    "did_you_mean", "env_overrides", "find_config_files", "load_config_files", "load_yaml", "merge",
    "options_markdown", "parse_config_text", "parse_value", "resolve", "select_site",
    "starter_config", "system_config_dir", "user_config_dir",
]
