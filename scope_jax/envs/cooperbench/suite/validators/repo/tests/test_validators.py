import validators


def test_is_even():
    assert validators.is_even(4)
    assert not validators.is_even(3)
    assert not validators.is_even("4")


def test_is_positive():
    assert validators.is_positive(0.5)
    assert not validators.is_positive(0)


def test_exports():
    assert set(validators.__all__) >= {"is_even", "is_positive"}
