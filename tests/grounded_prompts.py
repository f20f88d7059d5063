"""Input-grounded chat prompts: the answer copies much of the prompt, so an n-gram draft accepts well.

Each entry is the full text of one user message (sent through the chat template).
"""

GROUNDED_PROMPTS = [
    "Rewrite this code with better variable names:\n\n"
    "def f(a, b):\n"
    "    c = 0\n"
    "    for d in a:\n"
    "        if d > b:\n"
    "            c = c + d\n"
    "    return c\n",
    "Fix the typo in: The quick brown fox jumpd over the lazy dog and ran into the forrest.",
    "Repeat the following list in reverse order: apple, banana, cherry, date, elderberry, fig, grape, honeydew.",
    "Convert this JSON to YAML:\n"
    '{"name": "Alice", "age": 30, "city": "Paris", "languages": ["English", "French"], "active": true}',
    "Add type hints to this Python function:\n\n"
    "def greet(name, times):\n"
    "    result = []\n"
    "    for i in range(times):\n"
    "        result.append('Hello, ' + name)\n"
    "    return result\n",
    "Convert this list to a numbered list:\n"
    "- Buy milk\n- Walk the dog\n- Write the report\n- Call the bank\n- Water the plants",
    "Correct the grammar in this sentence: She don't like going to the school on monday because it are boring.",
    "Make every word in this sentence uppercase: the cat sat on the mat and looked at the moon.",
    "Add comments to this code:\n\n"
    "for i in range(10):\n"
    "    if i % 2 == 0:\n"
    "        print(i, 'is even')\n"
    "    else:\n"
    "        print(i, 'is odd')\n",
    "Convert this CSV to a Markdown table:\nname,age,city\nAlice,30,Paris\nBob,25,London\nCarol,35,Berlin",
    "Rename the variable x to total in this code:\n\n"
    "x = 0\n"
    "for price in prices:\n"
    "    x += price\n"
    "print('The sum is', x)\n",
    "Repeat this sentence exactly three times: The early bird catches the worm.",
]

# For the CLI test (not in GROUNDED_PROMPTS, so the CLI run is a fresh generation).
CLI_PROMPT = "Repeat the following list in reverse order: red, orange, yellow, green, blue, indigo, violet."
