"""The retail domain: its 16 agent tools over products, users and orders (tau2-bench's semantics).

Every check runs in tau2-bench's order and fails with its exact message (the toolkit prefixes `Error: `):
address parts that are not strings give pydantic's validation text (every wrong part), and a reason that
is not hashable (a list) gives Python's `unhashable type: 'list'`, as tau2-bench's set lookup does.
By default the domain's quirks are reproduced, since they decide the database hash and what the agent
sees (docs/tau2.md):
  Q1  modify-items gives every modified item the price and options of the last pair's new variant
  Q2  cancelling refunds every payment-history entry, earlier refunds included
  Q3  the modify-items price difference is not rounded (the exchange difference is)
  Q4  address and payment changes accept any status containing "pending"
  Q5  exchanges and returns only record the request (no money moves): the design, kept by the fix
  Q6  arguments are not type checked ("19122" vs 19122 fails as "not found")
  Q7  read tools return the stored records (harmless: results are serialised at once)
  Q8  an exchange may keep an item's id (modify-items refuses that)
  Q9  amounts are floats throughout (a hash matter: 0.0, not 0), except an exchange's difference over
      no items, which stays the integer 0
With `fix_quirks`, Q1 (own variant per item), Q2 (refund each method's net payment once), Q3 (rounded),
Q4 (exact "pending"), Q6 (arguments type checked against the signature) and Q8 (old == new refused) are
fixed; Q5, Q7 and Q9 stay.

Records are stored in tau2-bench's field order (that order shows in results); `normalize_record` puts
a loaded record into it, filling the optional order fields with None.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from scope_jax.envs.tau2.arithmetic import ALLOWED, evaluate
from scope_jax.envs.tau2.db import Record
from scope_jax.envs.tau2.toolkit import GENERIC, READ, WRITE, Toolkit, tool

TABLES = ("products", "users", "orders")
ADDRESS = ("address1", "address2", "city", "country", "state", "zip")
ORDER = ("order_id", "user_id", "address", "items", "status", "fulfillments", "payment_history")
ORDER_OPTIONAL = ("cancel_reason", "exchange_items", "exchange_new_items", "exchange_payment_method_id",
                  "exchange_price_difference", "return_items", "return_payment_method_id")
ITEM = ("name", "product_id", "item_id", "price", "options")
PAYMENT = ("transaction_type", "amount", "payment_method_id")
USER = ("user_id", "name", "address", "email", "payment_methods", "orders")
PAYMENT_METHOD = {"credit_card": ("source", "id", "brand", "last_four"),
                  "gift_card": ("source", "id", "balance"), "paypal": ("source", "id")}
PRODUCT = ("name", "product_id", "variants")
VARIANT = ("item_id", "options", "available", "price")
CANCEL_REASONS = frozenset({"no longer needed", "ordered by mistake"})  # a set: an unhashable reason raises
# pydantic's error link in the version tau2-bench's reference numbers were computed with (2.13)
PYDANTIC_STRING_TYPE_URL = "https://errors.pydantic.dev/2.13/v/string_type"


def _ordered(record: Record, fields: tuple[str, ...], what: str) -> Record:
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(f"a {what} record lacks {', '.join(missing)}")
    return {f: record[f] for f in fields}


def _address(record: Record) -> Record:
    return _ordered(record, ADDRESS, "address")


def _payment(record: Record) -> Record:
    payment = _ordered(record, PAYMENT, "payment")
    payment["amount"] = float(payment["amount"])
    return payment


def normalize_record(table: str, record: Record) -> Record:
    """A record of a retail table in field order (optional order fields filled with None, amounts as
    floats); ValueError if it lacks a field."""
    if table == "products":
        product = _ordered(record, PRODUCT, "product")
        product["variants"] = {k: dict(_ordered(v, VARIANT, "variant"), price=float(v["price"]))
                               for k, v in product["variants"].items()}
        return product
    if table == "users":
        user = _ordered(record, USER, "user")
        user["address"] = _address(user["address"])
        user["payment_methods"] = {k: _payment_method(m) for k, m in user["payment_methods"].items()}
        return user
    order = dict(_ordered(record, ORDER, "order"), **{f: record.get(f) for f in ORDER_OPTIONAL})
    order["address"] = _address(order["address"])
    order["items"] = [dict(_ordered(i, ITEM, "order item"), price=float(i["price"])) for i in order["items"]]
    order["payment_history"] = [_payment(p) for p in order["payment_history"]]
    return order


def _payment_method(method: Record) -> Record:
    source = method.get("source")
    if source not in PAYMENT_METHOD:
        raise ValueError(f"payment method source {source!r} is not one of {', '.join(PAYMENT_METHOD)}")
    method = _ordered(method, PAYMENT_METHOD[source], f"{source} payment method")
    if source == "gift_card":
        method["balance"] = float(method["balance"])
    return method


@dataclasses.dataclass(frozen=True)
class SwapRules:
    """Where modify-items and exchange differ in their shared checks: the status and the error texts."""

    status: str
    status_error: str
    multiplicity_error: str  # formatted with item_id
    length_error: str
    gift_card_error: str


MODIFY = SwapRules("pending", "Non-pending order cannot be modified", "{item_id} not found",
                   "The number of items to be exchanged should match",
                   "Insufficient gift card balance to pay for the new item")
EXCHANGE = SwapRules("delivered", "Non-delivered order cannot be exchanged", "Number of {item_id} not found.",
                     "The number of items to be exchanged should match.",
                     "Insufficient gift card balance to pay for the price difference")


def _pydantic_repr(value: Any) -> str:
    """How pydantic 2 shows an input in a validation error: its repr, cut to 25 + "..." + 24 characters
    when longer than 50."""
    text = repr(value)
    return f"{text[:25]}...{text[-24:]}" if len(text) > 50 else text


def _new_address(address1: Any, address2: Any, city: Any, state: Any, country: Any, zip: Any) -> Record:
    """An address record in field order. tau2-bench builds it as a pydantic `UserAddress`, so parts that
    are not strings fail with pydantic's validation text, every wrong part in field order."""
    address = {"address1": address1, "address2": address2, "city": city, "country": country, "state": state,
               "zip": zip}
    wrong = [(part, value) for part, value in address.items() if not isinstance(value, str)]
    if wrong:
        lines = [f"{len(wrong)} validation error{'s' if len(wrong) > 1 else ''} for UserAddress"]
        for part, value in wrong:
            lines += [part, f"  Input should be a valid string [type=string_type, input_value="
                            f"{_pydantic_repr(value)}, input_type={type(value).__name__}]",
                      f"    For further information visit {PYDANTIC_STRING_TYPE_URL}"]
        raise ValueError("\n".join(lines))
    return address


def _new_payment(kind: str, amount: float, payment_method_id: str) -> Record:
    return {"transaction_type": kind, "amount": float(amount), "payment_method_id": payment_method_id}


class RetailTools(Toolkit):
    """The retail agent's tools. (Docstrings are the tool descriptions the model sees.)"""

    # ------------------------------------------------------------------------------------- lookups

    def _order(self, order_id: str) -> Record:
        order = self.db.get("orders", order_id)
        if order is None:
            raise ValueError("Order not found")
        return order

    def _user(self, user_id: str) -> Record:
        user = self.db.get("users", user_id)
        if user is None:
            raise ValueError("User not found")
        return user

    def _product(self, product_id: str) -> Record:
        product = self.db.get("products", product_id)
        if product is None:
            raise ValueError("Product not found")
        return product

    def _variant(self, product_id: str, item_id: str) -> Record:
        variant = self._product(product_id)["variants"].get(item_id)
        if variant is None:
            raise ValueError("Variant not found")
        return variant

    def _payment_method(self, user_id: str, payment_method_id: str) -> Record:
        methods = self._user(user_id)["payment_methods"]
        if payment_method_id not in methods:
            raise ValueError("Payment method not found")
        return methods[payment_method_id]

    def _writable_method(self, user_id: str, payment_method_id: str) -> Record:
        self._payment_method(user_id, payment_method_id)
        return self.db.writable("users", user_id)["payment_methods"][payment_method_id]

    def _is_pending(self, order: Record) -> bool:
        """Q4: address and payment changes take "pending (item modified)" too (fixed: exactly "pending")."""
        return order["status"] == "pending" if self.fix_quirks else "pending" in order["status"]

    @staticmethod
    def _check_multiplicity(order: Record, item_ids: list[str], message: str) -> None:
        """Each id may be asked for at most as many times as the order holds it."""
        held = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > held.count(item_id):
                raise ValueError(message.format(item_id=item_id))

    def _checked_swap(self, rules: SwapRules, order_id: str, item_ids: list[str], new_item_ids: list[str],
                      payment_method_id: str, refuse_same: bool,
                      rounded: bool) -> tuple[list[Record], float, Record]:
        """The checks shared by modify-items and exchange, in tau2-bench's order: (new variants, price
        difference, payment method)."""
        order = self._order(order_id)
        if order["status"] != rules.status:
            raise ValueError(rules.status_error)
        self._check_multiplicity(order, item_ids, rules.multiplicity_error)
        if len(item_ids) != len(new_item_ids):
            raise ValueError(rules.length_error)
        variants, difference = self._new_variants(order, item_ids, new_item_ids, refuse_same)
        if rounded:
            difference = round(difference, 2)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < difference:
            raise ValueError(rules.gift_card_error)
        return variants, difference, method

    def _new_variants(self, order: Record, item_ids: list[str], new_item_ids: list[str],
                      refuse_same: bool) -> tuple[list[Record], float]:
        """The new variant of each (old, new) pair, checked as tau2-bench does, and the summed price
        difference (unrounded; 0 as an int for no pairs)."""
        variants, difference = [], 0
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            if refuse_same and item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next(i for i in order["items"] if i["item_id"] == item_id)
            variant = self._variant(item["product_id"], new_item_id)
            if not variant["available"]:
                raise ValueError(f"New item {new_item_id} not found or available")
            variants.append(variant)
            difference += variant["price"] - item["price"]
        return variants, difference

    # --------------------------------------------------------------------------------------- tools

    @tool(GENERIC)
    def calculate(self, expression: str) -> str:
        """Calculate the value of an arithmetic expression.

        Args:
            expression: The expression, using numbers, parentheses and the operators + - * /,
                e.g. "2 * (3 + 4)".
        """
        if not all(c in ALLOWED for c in expression):
            raise ValueError("Invalid characters in expression")
        return str(round(float(evaluate(expression)), 2))

    @tool(WRITE)
    def cancel_pending_order(self, order_id: str, reason: str) -> Record:
        """Cancel a pending order.

        Paid amounts are refunded: at once to a gift card, in 5 to 7 business days otherwise.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
            reason: Why the order is cancelled: 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise ValueError("Invalid reason")
        order = self.db.writable("orders", order_id)
        refunds = []
        for method_id, amount in self._refund_amounts(order["payment_history"]):
            refunds.append(_new_payment("refund", amount, method_id))
            if self._payment_method(order["user_id"], method_id)["source"] == "gift_card":
                method = self._writable_method(order["user_id"], method_id)
                method["balance"] = round(method["balance"] + amount, 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    def _refund_amounts(self, history: list[Record]) -> list[tuple[str, float]]:
        """(method, amount) to refund on cancellation. Q2: one refund per history entry, refunds included
        (fixed: each method's payments minus its refunds, where positive)."""
        if not self.fix_quirks:
            return [(p["payment_method_id"], p["amount"]) for p in history]
        net: dict[str, float] = {}
        for p in history:
            sign = 1 if p["transaction_type"] == "payment" else -1
            net[p["payment_method_id"]] = net.get(p["payment_method_id"], 0.0) + sign * p["amount"]
        return [(method_id, round(amount, 2)) for method_id, amount in net.items() if round(amount, 2) > 0]

    @tool(WRITE)
    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> Record:
        """Exchange items of a delivered order for other variants of the same products.

        All items to exchange must go in one call: an order can be exchanged only once. The price
        difference is paid from, or refunded to, the given payment method; a gift card must cover it.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
            item_ids: The ids of the items to exchange (an id may repeat as often as the order holds it).
            new_item_ids: The ids of the new variants, one for each item id, in the same order.
            payment_method_id: The payment method for the price difference, e.g. 'gift_card_0000000'
                or 'credit_card_0000000'.
        """
        _, difference, _ = self._checked_swap(EXCHANGE, order_id, item_ids, new_item_ids, payment_method_id,
                                              refuse_same=self.fix_quirks, rounded=True)
        order = self.db.writable("orders", order_id)
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = difference
        return order

    @tool(READ)
    def find_user_id_by_email(self, email: str) -> str:
        """Find a user's id from their email address.

        Args:
            email: The email address, e.g. 'someone@example.com'.
        """
        for user_id, user in self.db.table("users").items():
            if user["email"].lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    @tool(READ)
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a user's id from their first name, last name and zip code.

        Args:
            first_name: The first name, e.g. 'John'.
            last_name: The last name, e.g. 'Doe'.
            zip: The zip code, e.g. '12345'.
        """
        for user_id, user in self.db.table("users").items():
            name = user["name"]
            if (name["first_name"].lower() == first_name.lower()
                    and name["last_name"].lower() == last_name.lower() and user["address"]["zip"] == zip):
                return user_id
        raise ValueError("User not found")

    @tool(READ)
    def get_item_details(self, item_id: str) -> Record:
        """Get an item's details: its options, availability and price.

        Args:
            item_id: The item id, e.g. '1234567890'.
        """
        for product in self.db.table("products").values():
            if item_id in product["variants"]:
                return product["variants"][item_id]
        raise ValueError("Item not found")

    @tool(READ)
    def get_order_details(self, order_id: str) -> Record:
        """Get an order's details: status, items, fulfilments and payments.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
        """
        return self._order(order_id)

    @tool(READ)
    def get_product_details(self, product_id: str) -> Record:
        """Get a product's details: its name and all its variants. A product id is not an item id.

        Args:
            product_id: The product id, e.g. '1234567890'.
        """
        return self._product(product_id)

    @tool(READ)
    def get_user_details(self, user_id: str) -> Record:
        """Get a user's details: name, address, email, payment methods and orders.

        Args:
            user_id: The user id, e.g. 'john_doe_1234'.
        """
        return self._user(user_id)

    @tool(READ)
    def list_all_product_types(self) -> str:
        """List the name and product id of every product type in the store."""
        names = {product["name"]: product["product_id"] for product in self.db.table("products").values()}
        return json.dumps(names, sort_keys=True)

    @tool(WRITE)
    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                     country: str, zip: str) -> Record:
        """Change the shipping address of a pending order.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
            address1: The first address line, e.g. '123 Main St'.
            address2: The second address line, e.g. 'Apt 1', or an empty string.
            city: The city, e.g. 'San Francisco'.
            state: The state, e.g. 'CA'.
            country: The country, e.g. 'USA'.
            zip: The zip code, e.g. '12345'.
        """
        order = self._order(order_id)
        if not self._is_pending(order):
            raise ValueError("Non-pending order cannot be modified")
        address = _new_address(address1, address2, city, state, country, zip)
        order = self.db.writable("orders", order_id)
        order["address"] = address
        return order

    @tool(WRITE)
    def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> Record:
        """Change items of a pending order to other variants of the same products.

        All items to change must go in one call: afterwards the order can be neither modified nor
        cancelled. The price difference is paid from, or refunded to, the given payment method; a gift
        card must cover it.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
            item_ids: The ids of the items to change (an id may repeat as often as the order holds it).
            new_item_ids: The ids of the new variants, one for each item id, in the same order.
            payment_method_id: The payment method for the price difference, e.g. 'gift_card_0000000'
                or 'credit_card_0000000'.
        """
        variants, difference, method = self._checked_swap(MODIFY, order_id, item_ids, new_item_ids,
                                                          payment_method_id, refuse_same=True,
                                                          rounded=self.fix_quirks)  # Q3
        order = self.db.writable("orders", order_id)
        order["payment_history"].append(
            _new_payment("payment" if difference > 0 else "refund", abs(difference), payment_method_id))
        if method["source"] == "gift_card":
            method = self._writable_method(order["user_id"], payment_method_id)
            method["balance"] = round(method["balance"] - difference, 2)
        for pair, (item_id, new_item_id) in enumerate(zip(item_ids, new_item_ids)):
            item = next(i for i in order["items"] if i["item_id"] == item_id)
            variant = variants[pair] if self.fix_quirks else variants[-1]  # Q1
            item["item_id"] = new_item_id
            item["price"] = variant["price"]
            item["options"] = dict(variant["options"])
        order["status"] = "pending (item modified)"
        return order

    @tool(WRITE)
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Record:
        """Change the payment method of a pending order; the old method is refunded.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
            payment_method_id: The new payment method, e.g. 'gift_card_0000000' or
                'credit_card_0000000'.
        """
        order = self._order(order_id)
        if not self._is_pending(order):
            raise ValueError("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        old_method_id, amount = history[0]["payment_method_id"], history[0]["amount"]
        if old_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        order = self.db.writable("orders", order_id)
        order["payment_history"].extend([_new_payment("payment", amount, payment_method_id),
                                         _new_payment("refund", amount, old_method_id)])
        if method["source"] == "gift_card":
            method = self._writable_method(order["user_id"], payment_method_id)
            method["balance"] = round(method["balance"] - amount, 2)
        if self._payment_method(order["user_id"], old_method_id)["source"] == "gift_card":
            old = self._writable_method(order["user_id"], old_method_id)
            old["balance"] = round(old["balance"] + amount, 2)
        return order

    @tool(WRITE)
    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str,
                            country: str, zip: str) -> Record:
        """Change a user's default address.

        Args:
            user_id: The user id, e.g. 'john_doe_1234'.
            address1: The first address line, e.g. '123 Main St'.
            address2: The second address line, e.g. 'Apt 1', or an empty string.
            city: The city, e.g. 'San Francisco'.
            state: The state, e.g. 'CA'.
            country: The country, e.g. 'USA'.
            zip: The zip code, e.g. '12345'.
        """
        self._user(user_id)
        address = _new_address(address1, address2, city, state, country, zip)
        user = self.db.writable("users", user_id)
        user["address"] = address
        return user

    @tool(WRITE)
    def return_delivered_order_items(self, order_id: str, item_ids: list[str],
                                     payment_method_id: str) -> Record:
        """Return items of a delivered order.

        The refund goes to the order's original payment method or to a gift card of the user.

        Args:
            order_id: The order id, with its leading '#', e.g. '#W0000000'.
            item_ids: The ids of the items to return (an id may repeat as often as the order holds it).
            payment_method_id: Where the refund goes: the order's original payment method or a gift
                card of the user.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        method = self._payment_method(order["user_id"], payment_method_id)
        original = order["payment_history"][0]["payment_method_id"]
        if method["source"] != "gift_card" and payment_method_id != original:
            raise ValueError("Payment method should be the original payment method")
        self._check_multiplicity(order, item_ids, "Some item not found")
        order = self.db.writable("orders", order_id)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    @tool(GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of their issue.

        Use it only when the request cannot be handled with the other tools.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"
