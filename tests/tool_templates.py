"""Chat templates that show tools, written here in the style of two real families (not copies of them), for the
tests of rendering with a model's own template: they use the features real ones use (``tools`` looped and
``tojson``-ed, assistant ``tool_calls`` with object arguments, ``role: "tool"`` results, ``bos_token``,
``raise_exception``, ``strftime_now``, namespaces)."""

from __future__ import annotations

# Qwen 2.5 / Hermes style: ChatML turns, tools listed in the system turn inside <tools></tools>, calls as
# <tool_call> blocks, results as <tool_response> blocks in a user turn.
CHATML_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Functions\\n\\nCall a function when it helps. Signatures:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nA call is <tool_call>\\n{\"name\": <name>, \"arguments\": <object>}\\n</tool_call>"
    "<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls | default([]) %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama 3.1 style: header-id turns, a dated system turn, the tools in the first user turn as indented JSON, calls as
# a bare {"name", "parameters"} object (one per turn, else raise_exception), results in an "ipython" turn.
HEADER_TOOLS = (
    "{{- bos_token }}"
    "{%- if date_string is not defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
    "{%- set ns = namespace(system='', tools_shown=false) %}"
    "{%- if messages[0].role == 'system' %}{%- set ns.system = messages[0].content %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nToday Date: ' + date_string + '\\n\\n' + ns.system"
    " + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{%- if tools and not ns.tools_shown %}"
    "{%- set ns.tools_shown = true %}"
    "{{- 'Answer with a JSON function call {\"name\": function name, \"parameters\": arguments} using one of:\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{%- endif %}"
    "{{- message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- if message.tool_calls | length != 1 %}{{- raise_exception('only one tool call per turn is supported') }}"
    "{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{\"name\": \"' + call.name + '\", \"parameters\": ' }}"
    "{{- call.arguments | tojson }}{{- '}<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
