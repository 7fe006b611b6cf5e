"""An error raised about a part of a file (a member of a build's package) is named by the file the
user passed, once, and one that names its own file keeps it."""

from cuvil_pgc.errors import BuildError


def test_an_error_without_a_file_is_named_by_the_one_being_read():
    err = BuildError("the program calls an operator this process has not defined", fix="import it")
    assert err.located("release.cuvilpkg") is err
    assert str(err) == "release.cuvilpkg: the program calls an operator this process has not defined (import it)"
    assert err.located("other.cuvilpkg").path == "release.cuvilpkg"


def test_an_error_naming_its_own_file_keeps_it():
    err = BuildError("truncated", path="model.onnx")
    assert str(err.located("release.cuvilpkg")) == "model.onnx: truncated"
