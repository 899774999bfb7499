"""The canonical DB and its hash: T1 and T3 of the sheet, copy-on-write against the plain hash rule, and
the serialised field order of results (sheet section 1.4)."""

import copy
import json

from scope_jax.envs.tau2 import retail as retail_module
from tests.envs.tau2.conftest import REFERENCE, plain_hash


def test_t1_fresh_retail_hash(retail):
    assert retail.db.hash() == REFERENCE["retail_initial"]
    assert plain_hash(retail.db.dump()) == REFERENCE["retail_initial"]


def test_t13_initial_mock_hash(mock_env):
    state = mock_env.domain_data.fresh()
    assert state.agent.db.hash().startswith(REFERENCE["mock_initial_prefix"])
    assert plain_hash(state.agent.db.dump()) == state.agent.db.hash()
    assert plain_hash(state.user.db.dump()) == state.user.db.hash()


def test_hash_after_writes_follows_the_plain_rule(retail):
    """The copy-on-write hash (cached texts of untouched records) equals the rule on a full dump."""
    cancel = {"order_id": "#W4862767", "reason": "no longer needed"}
    assert not retail.call("cancel_pending_order", cancel).error
    assert not retail.call("modify_user_address", {
        "user_id": "ava_moore_2033", "address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX",
        "country": "USA", "zip": "73301"}).error
    assert retail.db.hash() != REFERENCE["retail_initial"]
    assert retail.db.hash() == plain_hash(retail.db.dump())


def test_t3_replay_is_deterministic_and_leaves_the_loaded_db_alone(retail_env):
    domain = retail_env.domain_data
    for task_id in ("20", "64", "101"):  # multi-item modify, a failing write, two writes to one order
        first = domain.gold_replay(domain.tasks[task_id]).state.hashes()
        second = domain.gold_replay(domain.tasks[task_id]).state.hashes()
        assert first == second
    for task in domain.tasks.values():
        domain.gold_replay(task)
    assert domain.fresh().agent.db.hash() == REFERENCE["retail_initial"]
    assert plain_hash(domain.agent_base.tables) == REFERENCE["retail_initial"]


def test_deep_copy_is_independent(retail):
    retail.call("cancel_pending_order", {"order_id": "#W4862767", "reason": "no longer needed"})
    copied = copy.deepcopy(retail.db)
    before = copied.hash()
    retail.call("modify_pending_order_address", {
        "order_id": "#W7208030", "address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX",
        "country": "USA", "zip": "73301"})
    copied.writable("orders", "#W4862767")["status"] = "pending"
    assert copied.get("orders", "#W7208030")["address"]["city"] != "Austin"
    assert retail.db.get("orders", "#W4862767")["status"] == "cancelled"
    assert copied.hash() != before and copied.hash() == plain_hash(copied.dump())


def test_results_keep_the_record_field_order(retail):
    order = json.loads(retail.call("get_order_details", {"order_id": "#W4862767"}).content)
    assert list(order) == [*retail_module.ORDER, *retail_module.ORDER_OPTIONAL]
    assert list(order["address"]) == ["address1", "address2", "city", "country", "state", "zip"]
    assert list(order["items"][0]) == ["name", "product_id", "item_id", "price", "options"]
    assert list(order["payment_history"][0]) == ["transaction_type", "amount", "payment_method_id"]
    user = json.loads(retail.call("get_user_details", {"user_id": "sophia_thomas_5301"}).content)
    assert list(user) == ["user_id", "name", "address", "email", "payment_methods", "orders"]
    assert list(user["payment_methods"]["gift_card_9178183"]) == ["source", "id", "balance"]
    assert list(user["payment_methods"]["credit_card_7326294"]) == ["source", "id", "brand", "last_four"]
    product = json.loads(retail.call("get_product_details", {"product_id": "8600330539"}).content)
    assert list(product) == ["name", "product_id", "variants"]
    assert list(product["variants"]["8479046075"]) == ["item_id", "options", "available", "price"]
    text = retail.call("get_item_details", {"item_id": "8479046075"}).content
    assert text.startswith('{"item_id": "8479046075", "options": {')
    assert text.endswith('"available": true, "price": 451.01}')
    # an order's address set by a tool is stored in field order too (country before state)
    changed = retail.call("modify_pending_order_address", {
        "order_id": "#W4862767", "address1": "a", "address2": "b", "city": "c", "state": "d", "country": "e",
        "zip": "f"}).content
    address = ('"address": {"address1": "a", "address2": "b", "city": "c", "country": "e", "state": "d", '
               '"zip": "f"}')
    assert address in changed
