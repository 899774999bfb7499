"""A product catalogue: product names and their prices."""


class Catalog:
    """Products by name, each with a price."""

    def __init__(self) -> None:
        self._prices: dict[str, float] = {}

    def add(self, name: str, price: float) -> None:
        """Add a product, or change its price."""
        if price < 0:
            raise ValueError("a price cannot be negative")
        self._prices[name] = price

    def price(self, name: str) -> float:
        """The product's price; KeyError for an unknown product."""
        return self._prices[name]

    def names(self) -> list[str]:
        """The product names, sorted."""
        return sorted(self._prices)
