"""Prompt sets shared by tests (short, varied; English, code and Chinese)."""

IDENTITY_PROMPTS = [
    "The quick brown fox", "Once upon a time", "def fibonacci(n):", "import numpy as np\n",
    "The capital of France is", "1, 2, 3, 4,", "Hello, my name is", "In 1492, Columbus",
    "今天天气", "The weather today is", "SELECT * FROM users WHERE", "Dear Sir or Madam,",
    "The mitochondria is", "for i in range(10):", "To be or not to be", "She opened the door and",
    "A B C D E F G", "Write a haiku about the sea", "The price of bitcoin", "class Stack:\n    def",
    "我们今天去公园", "Roses are red,", "Step 1: preheat the oven", "The theory of relativity",
    "git commit -m", "Once more unto the breach", "#include <stdio.h>\n", "The answer is 42 because",
    "Translate to French: cat", "Q: What is 2+2?\nA:", "Lorem ipsum dolor sit amet",
]
