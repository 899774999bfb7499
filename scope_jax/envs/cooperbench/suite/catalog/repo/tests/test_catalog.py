import pytest

from catalog import Catalog


def test_add_and_price():
    catalog = Catalog()
    catalog.add("tea", 2.5)
    catalog.add("coffee", 3.0)
    assert catalog.price("tea") == 2.5
    assert catalog.names() == ["coffee", "tea"]


def test_negative_price():
    with pytest.raises(ValueError):
        Catalog().add("tea", -1)


def test_unknown_product():
    with pytest.raises(KeyError):
        Catalog().price("tea")
