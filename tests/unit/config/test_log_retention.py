"""log_retention (issue 34, point 4): how long an ended cluster's files stay; a duration, 0, or never."""

import pytest

from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.config.schema import parse_value


@pytest.mark.parametrize("written, seconds", [("7d", 7 * 86400), ("12h", 43200), ("1h30m", 5400), (3600, 3600),
                                              (0, 0), ("0", 0), ("never", None), ("Never", None), (False, None)])
def test_a_duration_zero_or_never(written, seconds):
    assert parse_value("log_retention", written) == seconds


def test_the_default_is_a_week_and_a_keyword_or_a_bad_value_is_checked(isolated_home):
    assert resolve().values["log_retention"] == 7 * 86400
    assert resolve(log_retention="never").values["log_retention"] is None
    with pytest.raises(ConfigError, match=r"log_retention='a week' is not a duration.*or never"):
        resolve(log_retention="a week")
