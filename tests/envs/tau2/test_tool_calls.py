"""Tool calls in text (the tolerant parser, its counted failures, ids), tool schemas for every tool, and the
chat templates: Qwen3's renders `tools=`, SmolLM2's (read from its GGUF file) ignores them."""

import inspect
import itertools
import json
import pathlib

import pytest

from scope_jax.envs.tau2 import mock, retail
from scope_jax.envs.tau2.prompts import template_renders_tools
from scope_jax.envs.tau2.schemas import parse_docstring, tool_schema, toolkit_schemas
from scope_jax.envs.tau2.tool_calls import format_tool_call, parse_tool_calls
from scope_jax.envs.tau2.toolkit import ToolCall
from scope_jax.models.tiny import word_tokenizer

QWEN3_TEMPLATE = (pathlib.Path(__file__).parents[2] / "fixtures" / "qwen3_chat_template.jinja").read_text()
CALL = {"name": "get_order_details", "arguments": {"order_id": "#W1"}}

# (generated text, expected calls as (name, arguments), expected content, expected failure count)
CASES = [
    ('<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>',
     [CALL], None, 0),
    ('Let me look.\n<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>',
     [CALL], "Let me look.", 0),
    ('<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}',
     [CALL], None, 0),  # cut off
    ('<tool_call>```json\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n```</tool_call>',
     [CALL], None, 0),
    ('<tool_call>{"name": "get_order_details", "arguments": "{\\"order_id\\": \\"#W1\\"}"}</tool_call>',
     [CALL], None, 0),  # arguments as a JSON string
    ('<tool_call>{"name": "get_order_details", "parameters": {"order_id": "#W1"}}</tool_call>',
     [CALL], None, 0),
    ("<tool_call>{'name': 'get_order_details', 'arguments': {'order_id': '#W1'}}</tool_call>",
     [CALL], None, 0),
    ('<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}} trailing</tool_call>',
     [CALL], None, 0),
    ('{"name": "get_order_details", "arguments": {"order_id": "#W1"}}', [CALL], None, 0),  # untagged, whole
    ('```json\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n```', [CALL], None, 0),
    ('<tool_call>{"name": "list_all_product_types"}</tool_call>',
     [{"name": "list_all_product_types", "arguments": {}}], None, 0),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
     '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
     [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}], None, 0),
    ("Your order #W1 is pending.", [], "Your order #W1 is pending.", 0),
    ('The JSON {"name": "x"} is text here.', [], 'The JSON {"name": "x"} is text here.', 0),
    ('{"order_id": "#W1"}', [], '{"order_id": "#W1"}', 0),  # an object without a name is text
    ("<tool_call>{not json</tool_call>", [], None, 1),
    ('<tool_call>{"arguments": {}}</tool_call>', [], None, 1),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [], None, 1),
    ('<tool_call>{"name": "f", "arguments": "nope"}</tool_call>', [], None, 1),
    ('Sure. <tool_call>broken</tool_call> <tool_call>{"name": "a", "arguments": {}}</tool_call>',
     [{"name": "a", "arguments": {}}], "Sure.", 1),
    # what json.loads rejects with ValueError (an integer of over 4300 digits) or RecursionError
    ('<tool_call>{"name": "f", "arguments": {"a": ' + "9" * 5000 + "}}</tool_call>", [], None, 1),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": ' + "9" * 5000 + '}"}</tool_call>', [], None, 1),
    ('<tool_call>{"name": "f", "arguments": ' + "[" * 3000 + "]" * 3000 + "}</tool_call>", [], None, 1),
    # a JSON escape of a lone surrogate is no text a tokenizer can encode
    ('<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>', [], None, 1),
    ('<tool_call>{"name": "f", "arguments": {"a": ["\\udfff"]}}</tool_call>', [], None, 1),
    ("<tool_call>{'name': 'f', 'arguments': {'\\ud800': 1}}</tool_call>", [], None, 1),
    ('<tool_call>{"name": "f", "arguments": {"a": "\\ud83d\\ude00"}}</tool_call>',
     [{"name": "f", "arguments": {"a": "\U0001f600"}}], None, 0),  # a surrogate pair is one character
    # an untagged object with a name that is no call: counted, and its text stays the content
    ('{"name": "get_order_details", "arguments": "order #W1"}', [],
     '{"name": "get_order_details", "arguments": "order #W1"}', 1),
    ('{"name": "get_order_details", "arguments": [1]}', [],
     '{"name": "get_order_details", "arguments": [1]}', 1),
    ('{"name": "", "arguments": {}}', [], '{"name": "", "arguments": {}}', 1),
    # an untagged object that names a tool but does not parse: counted, and its text stays the content
    ('{"name": "get_order_details" "arguments": {}}', [], '{"name": "get_order_details" "arguments": {}}', 1),
    ("{'arguments': {}, 'name': get_order_details}", [], "{'arguments': {}, 'name': get_order_details}", 1),
    ('{"name": "f", "arguments": {"a": ' + "9" * 5000 + "}}", [], '{"name": "f", "arguments": {"a": '
     + "9" * 5000 + "}}", 1),
    ('{"order": "#W1" "status": "pending"}', [], '{"order": "#W1" "status": "pending"}', 0),  # no name: text
]


@pytest.mark.parametrize("text,calls,content,failures", CASES, ids=[str(i) for i in range(len(CASES))])
def test_parser(text, calls, content, failures):
    ids = (f"id_{i}" for i in itertools.count())
    parsed = parse_tool_calls(text, lambda: next(ids), requestor="user")
    assert [{"name": c.name, "arguments": c.arguments} for c in parsed.calls] == calls
    assert [c.id for c in parsed.calls] == [f"id_{i}" for i in range(len(calls))]
    assert all(c.requestor == "user" for c in parsed.calls)
    assert parsed.content == content
    assert len(parsed.failures) == failures


def test_format_round_trip():
    arguments = {"order_id": "#W1", "item_ids": ["1"], "new_item_ids": ["3"], "payment_method_id": "x"}
    call = ToolCall("modify_pending_order_items", arguments)
    text = format_tool_call(call)
    assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")
    parsed = parse_tool_calls(text, lambda: "x").calls[0]
    assert (parsed.name, parsed.arguments) == (call.name, call.arguments)


@pytest.mark.parametrize("toolkit", [retail.RetailTools, mock.MockTools, mock.MockUserTools])
def test_schemas_cover_every_tool_and_argument(toolkit):
    schemas = toolkit_schemas(toolkit)
    assert [s["function"]["name"] for s in schemas] == sorted(toolkit.tools)
    for schema in schemas:
        function = schema["function"]
        method = getattr(toolkit, function["name"])
        parameters = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
        properties = function["parameters"]["properties"]
        assert schema["type"] == "function" and function["description"]
        assert function["parameters"]["type"] == "object" and function["parameters"]["title"] == "parameters"
        assert list(properties) == [p.name for p in parameters]
        assert function["parameters"]["required"] == [p.name for p in parameters if p.default is p.empty]
        assert all(prop["description"] and prop["title"] for prop in properties.values())
    assert len(toolkit_schemas(retail.RetailTools)) == 16 if toolkit is retail.RetailTools else True


def test_schema_details():
    schema = tool_schema(retail.RetailTools.modify_pending_order_items)["function"]
    assert schema["description"].startswith("Change items of a pending order to other variants of the same "
                                            "products.\n\nAll items to change must go in one call:")
    item_ids = schema["parameters"]["properties"]["item_ids"]
    assert item_ids["type"] == "array" and item_ids["items"] == {"type": "string"}
    assert item_ids["title"] == "Item Ids"
    assert schema["parameters"]["properties"]["payment_method_id"]["description"].endswith(
        "e.g. 'gift_card_0000000' or 'credit_card_0000000'.")  # a wrapped Args line is joined
    description = tool_schema(mock.MockTools.create_task)["function"]["parameters"]["properties"]
    description = description["description"]
    assert description["anyOf"] == [{"type": "string"}, {"type": "null"}] and description["default"] is None
    listing = tool_schema(retail.RetailTools.list_all_product_types)["function"]
    assert listing["parameters"]["properties"] == {} and listing["parameters"]["required"] == []
    doc = "One.\n\nTwo\nlines.\n\nArgs:\n    x: An x\n        continued.\nReturns:\n    y"
    assert parse_docstring(doc) == ("One.\n\nTwo lines.", {"x": "An x continued."})


def test_chat_templates_and_tools():
    from scope_jax.models.gguf import read_header
    from scope_jax.models.hf import smollm2_path

    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    smollm2_template = read_header(path)[0]["tokenizer.chat_template"]
    schemas = toolkit_schemas(retail.RetailTools)
    words = ("system", "user")
    assert not template_renders_tools(word_tokenizer(words, chat_template=smollm2_template), schemas)
    qwen3 = word_tokenizer(words, chat_template=QWEN3_TEMPLATE)
    assert template_renders_tools(qwen3, schemas)
    text = qwen3.apply_chat_template([{"role": "system", "content": "system"}], tools=schemas, tokenize=False)
    assert json.dumps(schemas[0], ensure_ascii=False) in text or '"name": "calculate"' in text
    assert "<tool_call>" in text  # Qwen3 asks for the format the parser reads
