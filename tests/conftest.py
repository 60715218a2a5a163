import pytest

import ocannl.session


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the files under golden/ from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts from a fresh session: ids, seed and default context reset."""
    ocannl.session.reset()
    yield
