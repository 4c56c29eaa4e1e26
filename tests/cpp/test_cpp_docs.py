"""docs/cpp.md shows the C example the tests compile and run (tests/cpp/test_cpp_greedy.py), as it is."""

from paths import ROOT


def test_docs_show_the_compiled_example():
    example = (ROOT / "cpp" / "examples" / "generate.c").read_text().rstrip()
    assert f"```c\n{example}\n```" in (ROOT / "docs" / "cpp.md").read_text()
