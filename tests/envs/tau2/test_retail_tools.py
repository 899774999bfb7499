"""Retail tools: T7 (every error string: exact text, error flag, DB unchanged), T8 (the quirks), successes,
and the quirk fixes. Ids come from the retail db.json (the fact sheet's section 2.1 describes them)."""

import json
import time

import pytest

from tests.envs.tau2.conftest import REFERENCE

PENDING = "#W4862767"  # sophia_thomas_5301; paid 2492.53 by paypal_5297429; gift_card_9178183 holds 66.0
DELIVERED = "#W9077205"  # amelia_wilson_4614; paid 591.58 by gift_card_7108145 (97.0); paypal_4101143
BOOKSHELF = "8479046075"  # an item of PENDING (Bookshelf, 451.01); 4894369688 is a 537.01 Bookshelf
PAYPAL = "paypal_5297429"


def swap(order_id, old, new, method=PAYPAL):
    """The arguments of modify_pending_order_items / exchange_delivered_order_items."""
    return {"order_id": order_id, "item_ids": old, "new_item_ids": new, "payment_method_id": method}


ADDRESS = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX", "country": "USA",
           "zip": "73301"}

# What pydantic 2.13 prints for a UserAddress built with city=None and zip=73301 (copied from its output).
PYDANTIC_TWO_ERRORS = (
    "Error: 2 validation errors for UserAddress\n"
    "city\n  Input should be a valid string [type=string_type, input_value=None, input_type=NoneType]\n"
    "    For further information visit https://errors.pydantic.dev/2.13/v/string_type\n"
    "zip\n  Input should be a valid string [type=string_type, input_value=73301, input_type=int]\n"
    "    For further information visit https://errors.pydantic.dev/2.13/v/string_type")

# (tool, arguments, the exact result)
ERRORS = [
    ("get_order_details", {"order_id": "W4862767"}, "Error: Order not found"),
    ("get_order_details", {"order_id": PENDING, "foo": 1},
     "Error: RetailTools.get_order_details() got an unexpected keyword argument 'foo'"),
    ("get_user_details", {"user_id": "nobody_0000"}, "Error: User not found"),
    ("get_product_details", {"product_id": BOOKSHELF}, "Error: Product not found"),  # an item id
    ("get_item_details", {"item_id": "8600330539"}, "Error: Item not found"),  # a product id
    ("find_user_id_by_email", {"email": "nobody@example.com"}, "Error: User not found"),
    ("find_user_id_by_name_zip", {"first_name": "Sophia", "last_name": "Thomas", "zip": 75396},
     "Error: User not found"),  # Q6: the number is not the zip string
    ("delete_order", {"order_id": PENDING}, "Error: Tool 'delete_order' not found."),
    ("calculate", {"expression": "2 + x"}, "Error: Invalid characters in expression"),
    ("calculate", {"expression": "1 / 0"}, "Error: division by zero"),
    ("calculate", {"expression": "2 +"}, "Error: invalid syntax (<string>, line 1)"),
    ("cancel_pending_order", {"order_id": PENDING},
     "Error: RetailTools.cancel_pending_order() missing 1 required positional argument: 'reason'"),
    ("cancel_pending_order", {"order_id": DELIVERED, "reason": "no longer needed"},
     "Error: Non-pending order cannot be cancelled"),
    ("cancel_pending_order", {"order_id": PENDING, "reason": "too expensive"}, "Error: Invalid reason"),
    ("cancel_pending_order", {"order_id": PENDING, "reason": ["no longer needed"]},
     "Error: unhashable type: 'list'"),  # tau2-bench looks the reason up in a set
    ("modify_user_address", {"user_id": "sophia_thomas_5301", **ADDRESS, "city": None, "zip": 73301},
     PYDANTIC_TWO_ERRORS),
    ("modify_pending_order_address", {"order_id": DELIVERED, **ADDRESS},
     "Error: Non-pending order cannot be modified"),
    ("modify_pending_order_address", {"order_id": "#W0000000", **ADDRESS}, "Error: Order not found"),
    ("modify_user_address", {"user_id": "nobody_0000", **ADDRESS}, "Error: User not found"),
    ("modify_pending_order_payment", {"order_id": DELIVERED, "payment_method_id": "paypal_4101143"},
     "Error: Non-pending order cannot be modified"),
    ("modify_pending_order_payment", {"order_id": PENDING, "payment_method_id": "credit_card_9789590"},
     "Error: Payment method not found"),  # another user's card
    ("modify_pending_order_payment", {"order_id": PENDING, "payment_method_id": "paypal_5297429"},
     "Error: The new payment method should be different from the current one"),
    ("modify_pending_order_payment", {"order_id": PENDING, "payment_method_id": "gift_card_9178183"},
     "Error: Insufficient gift card balance to pay for the order"),
    ("modify_pending_order_items", swap(DELIVERED, ["9370300555"], ["4068787148"], "paypal_4101143"),
     "Error: Non-pending order cannot be modified"),
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF, BOOKSHELF], ["8895454203", "6735339143"]),
     f"Error: {BOOKSHELF} not found"),  # asked twice, held once
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF], []),
     "Error: The number of items to be exchanged should match"),
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF], [BOOKSHELF]),
     "Error: The new item id should be different from the old item id"),
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF], ["1793929609"]),
     "Error: Variant not found"),  # an office chair: another product
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF], ["7373893106"]),
     "Error: New item 7373893106 not found or available"),
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF], ["8895454203"], "credit_card_9789590"),
     "Error: Payment method not found"),
    ("modify_pending_order_items", swap(PENDING, [BOOKSHELF], ["4894369688"], "gift_card_9178183"),
     "Error: Insufficient gift card balance to pay for the new item"),  # 86.0 > 66.0
    ("exchange_delivered_order_items", swap(PENDING, [BOOKSHELF], ["8895454203"]),
     "Error: Non-delivered order cannot be exchanged"),
    ("exchange_delivered_order_items",
     swap(DELIVERED, ["9370300555", "9370300555"], ["4068787148", "3112842858"], "paypal_4101143"),
     "Error: Number of 9370300555 not found."),
    ("exchange_delivered_order_items", swap(DELIVERED, ["9370300555"], [], "paypal_4101143"),
     "Error: The number of items to be exchanged should match."),
    ("exchange_delivered_order_items", swap(DELIVERED, ["9370300555"], ["2444431651"], "paypal_4101143"),
     "Error: Variant not found"),
    ("exchange_delivered_order_items", swap(DELIVERED, ["9370300555"], ["3614853563"], "paypal_4101143"),
     "Error: New item 3614853563 not found or available"),
    ("exchange_delivered_order_items", swap("#W4817420", ["4900661478"], ["4894369688"], "gift_card_8168843"),
     "Error: Insufficient gift card balance to pay for the price difference"),  # 73.97 > 69.0
    ("return_delivered_order_items", {"order_id": PENDING, "item_ids": [BOOKSHELF],
                                      "payment_method_id": "paypal_5297429"},
     "Error: Non-delivered order cannot be returned"),
    ("return_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["9370300555"],
                                      "payment_method_id": "paypal_4101143"},
     "Error: Payment method should be the original payment method"),
    ("return_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["9370300555"],
                                      "payment_method_id": "paypal_0000000"},
     "Error: Payment method not found"),
    ("return_delivered_order_items", {"order_id": DELIVERED, "item_ids": ["1234567890"],
                                      "payment_method_id": "gift_card_7108145"},
     "Error: Some item not found"),
]


@pytest.mark.parametrize("tool,arguments,expected", ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_t7_error_results(retail, tool, arguments, expected):
    result = retail.call(tool, arguments)
    assert (result.content, result.error) == (expected, True)
    assert retail.db.hash() == REFERENCE["retail_initial"]


def test_t7_modify_payment_only_once(retail):
    assert not retail.call("modify_pending_order_payment", {"order_id": PENDING,
                                                            "payment_method_id": "credit_card_7326294"}).error
    again = retail.call("modify_pending_order_payment", {"order_id": PENDING,
                                                         "payment_method_id": "credit_card_1034663"})
    assert again.content == "Error: There should be exactly one payment for a pending order" and again.error


def test_successful_reads(retail):
    assert retail.call("calculate", {"expression": "2 + 2"}).content == "4.0"
    assert retail.call("calculate", {"expression": "10 / 3"}).content == "3.33"
    assert retail.call("calculate", {"expression": "2 ** 10"}).content == "1024.0"
    started = time.perf_counter()
    huge = retail.call("calculate", {"expression": "9**9**9**9"})
    assert huge.error and "too large" in huge.content and time.perf_counter() - started < 1.0
    assert retail.call("find_user_id_by_email", {"email": "Sophia.Thomas1364@example.com"}).content == \
        "sophia_thomas_5301"
    assert retail.call("find_user_id_by_name_zip", {"first_name": "SOPHIA", "last_name": "thomas",
                                                    "zip": "75396"}).content == "sophia_thomas_5301"
    types = json.loads(retail.call("list_all_product_types", {}).content)
    assert len(types) == 50 and list(types) == sorted(types) and types["Bookshelf"] == "8600330539"
    assert retail.call("transfer_to_human_agents", {"summary": "x"}).content == "Transfer successful"


def _order(toolkit, order_id):
    return json.loads(toolkit.call("get_order_details", {"order_id": order_id}).content)


def _balance(toolkit, user_id, method_id):
    user = json.loads(toolkit.call("get_user_details", {"user_id": user_id}).content)
    return user["payment_methods"][method_id]["balance"]


def test_t8_task_20_last_variant_everywhere(retail_env):
    domain = retail_env.domain_data
    toolkit = domain.gold_replay(domain.tasks["20"]).state.agent
    order = _order(toolkit, "#W9911714")
    makeup_kit = [i for i in order["items"] if i["item_id"] == "2882812427"][0]  # the last pair's new variant
    assert [i["price"] for i in order["items"]] == [261.11] * 4
    assert all(i["options"] == makeup_kit["options"] for i in order["items"])
    assert order["status"] == "pending (item modified)"
    assert order["payment_history"][-1] == {"transaction_type": "payment", "amount": 71.96000000000001,
                                            "payment_method_id": "gift_card_4332117"}
    assert _balance(toolkit, "ethan_garcia_1261", "gift_card_4332117") == 14.04
    assert _balance(domain.fresh().agent, "ethan_garcia_1261", "gift_card_4332117") == 86.0


def test_t8_payment_change_then_cancel_refunds_twice(retail):
    assert _balance(retail, "ethan_lopez_6291", "gift_card_7219486") == 49.0
    retail.call("modify_pending_order_payment", {"order_id": "#W6779827",
                                                 "payment_method_id": "credit_card_9789590"})
    assert _balance(retail, "ethan_lopez_6291", "gift_card_7219486") == 4128.45
    retail.call("cancel_pending_order", {"order_id": "#W6779827", "reason": "ordered by mistake"})
    assert _balance(retail, "ethan_lopez_6291", "gift_card_7219486") == 12287.35
    order = _order(retail, "#W6779827")
    assert len(order["payment_history"]) == 6 and order["cancel_reason"] == "ordered by mistake"


def test_t8_empty_modification_and_same_sku_exchange(retail):
    result = retail.call("modify_pending_order_items", swap(PENDING, [], []))
    order = json.loads(result.content)
    assert order["status"] == "pending (item modified)"
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": 0.0,
                                            "payment_method_id": "paypal_5297429"}
    assert isinstance(order["payment_history"][-1]["amount"], float)
    # Q4: the address may still change after the modification; items may not
    assert not retail.call("modify_pending_order_address", {"order_id": PENDING, **ADDRESS}).error
    exchange = retail.call("exchange_delivered_order_items",
                           swap(DELIVERED, ["3877338112"], ["3877338112"], "paypal_4101143"))
    assert not exchange.error
    assert json.loads(exchange.content)["exchange_price_difference"] == 0.0


def test_exchange_and_return_record_intent_only(retail):
    before = _balance(retail, "amelia_wilson_4614", "gift_card_7108145")
    order = json.loads(retail.call("exchange_delivered_order_items", swap(
        DELIVERED, ["3877338112", "9370300555"], ["2444431651", "4068787148"], "gift_card_7108145")).content)
    assert order["status"] == "exchange requested"
    assert order["exchange_items"] == ["3877338112", "9370300555"]  # each list sorted on its own
    assert order["exchange_new_items"] == ["2444431651", "4068787148"]
    assert order["exchange_price_difference"] == round((534.84 - 545.68) + (52.01 - 45.9), 2)
    assert len(order["payment_history"]) == 1 and _balance(retail, "amelia_wilson_4614",
                                                           "gift_card_7108145") == before
    returned = json.loads(retail.call("return_delivered_order_items", {
        "order_id": "#W4817420", "item_ids": ["4900661478"], "payment_method_id": "gift_card_8168843"},
    ).content)
    assert returned["status"] == "return requested" and returned["return_items"] == ["4900661478"]


# ------------------------------------------------------------------------------------ the quirk fixes


def test_fix_q1_q3_each_item_gets_its_own_variant(fixed_retail):
    order = json.loads(fixed_retail.call("modify_pending_order_items", swap(
        PENDING, [BOOKSHELF, "8323284863"], ["8895454203", "1793929609"])).content)
    prices = {i["item_id"]: i["price"] for i in order["items"]}
    assert prices["8895454203"] == 504.65 and prices["1793929609"] == 514.34
    assert order["payment_history"][-1]["amount"] == round(504.65 - 451.01 + 514.34 - 511.24, 2)


def test_fix_q2_cancel_refunds_net_payments(fixed_retail):
    fixed_retail.call("modify_pending_order_payment", {"order_id": "#W6779827",
                                                       "payment_method_id": "credit_card_9789590"})
    fixed_retail.call("cancel_pending_order", {"order_id": "#W6779827", "reason": "ordered by mistake"})
    assert _balance(fixed_retail, "ethan_lopez_6291", "gift_card_7219486") == 4128.45
    history = _order(fixed_retail, "#W6779827")["payment_history"]
    assert history[-1] == {"transaction_type": "refund", "amount": 4079.45,
                           "payment_method_id": "credit_card_9789590"}
    assert len(history) == 4


def test_fix_q4_q6_q8(fixed_retail):
    fixed_retail.call("modify_pending_order_items", swap(PENDING, [], []))
    assert fixed_retail.call("modify_pending_order_address", {"order_id": PENDING, **ADDRESS}).content == \
        "Error: Non-pending order cannot be modified"
    typed = fixed_retail.call("find_user_id_by_name_zip", {"first_name": "Sophia", "last_name": "Thomas",
                                                           "zip": 75396})
    assert typed.content == "Error: Argument zip must be of type str, got int"
    same = fixed_retail.call("exchange_delivered_order_items",
                             swap(DELIVERED, ["3877338112"], ["3877338112"], "paypal_4101143"))
    assert same.content == "Error: The new item id should be different from the old item id"


WRONG_PARTS = [  # address parts that are not strings, some with reprs about pydantic's 50-character cut
    {"address1": 1, "city": 5.5, "country": None, "state": True, "zip": ["a"]},
    {"city": {"a": 1}, "zip": list(range(40))},
    {"address2": "x" * 48, "zip": ["y" * 45]}, {"zip": ["y" * 46]}, {"zip": ["y" * 47]},
]


@pytest.mark.parametrize("wrong", WRONG_PARTS)
def test_address_errors_read_as_pydantics(retail, wrong):
    pydantic = pytest.importorskip("pydantic", reason="pydantic (the reference) is not installed")

    class UserAddress(pydantic.BaseModel):  # tau2-bench's model: six strings in this order
        address1: str
        address2: str
        city: str
        country: str
        state: str
        zip: str

    arguments = {**ADDRESS, **wrong}
    with pytest.raises(pydantic.ValidationError) as reference:
        UserAddress(**arguments)
    expected = str(reference.value).replace(f"/{pydantic.version.VERSION.rsplit('.', 1)[0]}/", "/2.13/")
    result = retail.call("modify_user_address", {"user_id": "sophia_thomas_5301", **arguments})
    assert (result.content, result.error) == ("Error: " + expected, True)
