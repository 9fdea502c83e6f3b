# Pinned excerpts of OSWorld (xlang-ai/OSWorld, Apache-2.0, Copyright 2024 XLANG NLP Lab), the code
# between an agent's action strings and the VM. OSWorld does not install from PyPI; sources, as
# stored in the public index (tests/eval/harness/README.md):
#   _fix_pyautogui_less_than_bug: desktop_env/desktop_env.py, mrwwk/DeskCraft @ 3ada4dc4 (an
#     import of OSWorld; same text in karakuri-ai/OSWorld-JP and the other forks), verbatim.
#   _fix_pyautogui_less_than_bug_jp, _fix_pyautogui_non_ascii: desktop_env/desktop_env.py,
#     karakuri-ai/OSWorld-JP @ 3301bf9f, verbatim but renamed (OSWorld-JP's DesktopEnv.step applies both).
#   DesktopEnv.step / evaluate: the same file of OSWorld-JP; the special actions and the FAIL /
#     infeasible logic verbatim, the rewrite a parameter (upstream's or OSWorld-JP's), the VM,
#     provider, setup and metric plumbing left out (marked "# pinned:").
#   run_single_example: lib_run_single.py, karakuri-ai/OSWorld-JP @ d936d4e6; edits marked "# pinned:".
from __future__ import annotations

import ast
import re


def _fix_pyautogui_less_than_bug(command: str) -> str:
    """
    Fix PyAutoGUI '<' character bug by converting it to hotkey("shift", ',') calls.
    
    This fixes the known PyAutoGUI issue where typing '<' produces '>' instead.
    References:
    - https://github.com/asweigart/pyautogui/issues/198
    - https://github.com/xlang-ai/OSWorld/issues/257
    
    Args:
        command (str): The original pyautogui command
        
    Returns:
        str: The fixed command with '<' characters handled properly
    """
    # Pattern to match press('<') or press('\u003c') calls  
    press_pattern = r'pyautogui\.press\(["\'](?:<|\\u003c)["\']\)'

    # Handle press('<') calls
    def replace_press_less_than(match):
        return 'pyautogui.hotkey("shift", ",")'
    
    # First handle press('<') calls
    command = re.sub(press_pattern, replace_press_less_than, command)

    # Pattern to match typewrite calls with quoted strings
    typewrite_pattern = r'pyautogui\.typewrite\((["\'])(.*?)\1\)'
    
    # Then handle typewrite calls
    def process_typewrite_match(match):
        quote_char = match.group(1)
        content = match.group(2)
        
        # Preprocess: Try to decode Unicode escapes like \u003c to actual '<'
        # This handles cases where '<' is represented as escaped Unicode
        try:
            # Attempt to decode unicode escapes
            decoded_content = content.encode('utf-8').decode('unicode_escape')
            content = decoded_content
        except UnicodeDecodeError:
            # If decoding fails, proceed with original content to avoid breaking existing logic
            pass  # English comment: Graceful degradation - fall back to original content if decoding fails
        
        # Check if content contains '<'
        if '<' not in content:
            return match.group(0)
        
        # Split by '<' and rebuild
        parts = content.split('<')
        result_parts = []
        
        for i, part in enumerate(parts):
            if i == 0:
                # First part
                if part:
                    result_parts.append(f"pyautogui.typewrite({quote_char}{part}{quote_char})")
            else:
                # Add hotkey for '<' and then typewrite for the rest
                result_parts.append('pyautogui.hotkey("shift", ",")')
                if part:
                    result_parts.append(f"pyautogui.typewrite({quote_char}{part}{quote_char})")
        
        return '; '.join(result_parts)
    
    command = re.sub(typewrite_pattern, process_typewrite_match, command)
    
    return command


def _fix_pyautogui_less_than_bug_jp(command: str) -> str:
    # TODO: .write should also be handled, but currently .typewrite only is handled

    # Pattern to match press('<') or press('\u003c') calls
    press_pattern = r'pyautogui\.press\(["\'](?:<|\\u003c)["\']\)'

    # Handle press('<') calls
    def replace_press_less_than(match):
        return 'pyautogui.hotkey("shift", ",")'

    # First handle press('<') calls
    command = re.sub(press_pattern, replace_press_less_than, command)

    # Pattern to match typewrite calls with quoted strings
    typewrite_pattern = r'pyautogui\.typewrite\((["\'])(.*?)\1\)'

    # Then handle typewrite calls
    def process_typewrite_match(match):
        quote_char = match.group(1)
        content = match.group(2)

        # Preprocess: Try to decode Unicode escapes like \u003c to actual '<'
        # This handles cases where '<' is represented as escaped Unicode
        try:
            # Attempt to decode unicode escapes
            # OLD (causes mojibake for Japanese text):
            # decoded_content = content.encode('utf-8').decode('unicode_escape')
            # NEW: Use ast.literal_eval with the original quote character
            decoded_content = ast.literal_eval(f'{quote_char}{content}{quote_char}')
            content = decoded_content
        except (UnicodeDecodeError, ValueError, SyntaxError):
            # If decoding fails, proceed with original content to avoid breaking existing logic
            pass  # English comment: Graceful degradation - fall back to original content if decoding fails

        # Check if content contains '<'
        if '<' not in content:
            return match.group(0)

        # Split by '<' and rebuild
        parts = content.split('<')
        result_parts = []

        for i, part in enumerate(parts):
            if i == 0:
                # First part
                if part:
                    result_parts.append(f"pyautogui.typewrite({quote_char}{part}{quote_char})")
            else:
                # Add hotkey for '<' and then typewrite for the rest
                result_parts.append('pyautogui.hotkey("shift", ",")')
                if part:
                    result_parts.append(f"pyautogui.typewrite({quote_char}{part}{quote_char})")

        return '; '.join(result_parts)

    command = re.sub(typewrite_pattern, process_typewrite_match, command)

    return command


def _fix_pyautogui_non_ascii(command: str) -> str:
    def replace_non_ascii_write(match):
        method = match.group(1)      # 'write' or 'typewrite'
        text = match.group(2)        # text content
        extra_args = match.group(3)  # interval=0.1 など (unused for clipboard paste)

        # For triple-quoted strings, text is already decoded
        # For single/double-quoted strings, decode escape sequences
        if match.group(0).find('"""') != -1 or match.group(0).find("'''") != -1:
            # Triple-quoted: use as-is
            decoded_text = text
        else:
            # Single/double-quoted: decode escape sequences (like \n, \t, Unicode escapes)
            # Extract the original quote character to properly decode the string
            original = match.group(0)
            quote_match = re.search(r'pyautogui\.(write|typewrite)\(([\"\'])', original)
            if quote_match:
                quote_char = quote_match.group(2)  # ' or "
                try:
                    # OLD (causes mojibake for Japanese text):
                    # decoded_text = text.encode().decode('unicode_escape')
                    # NEW: Use ast.literal_eval with the original quote character
                    # This properly handles escape sequences (\n, \t, \x, \u) AND non-ASCII characters
                    decoded_text = ast.literal_eval(f'{quote_char}{text}{quote_char}')
                except:
                    decoded_text = text
            else:
                # Fallback if quote character not found
                decoded_text = text

        # Check if text contains non-ASCII characters
        try:
            decoded_text.encode('ascii')
            # ASCII only - return original
            return match.group(0)
        except (UnicodeEncodeError, UnicodeDecodeError):
            # Contains non-ASCII - convert to clipboard paste
            # Escape quotes for Python string
            escaped_text = decoded_text.replace('\\', '\\\\').replace("'", "\\'")

            # Use clipboard paste instead
            # Note: pyperclip is imported in pkgs_prefix
            return f"pyperclip.copy('{escaped_text}'); pyautogui.hotkey('ctrl', 'v')"

    # Pattern for triple-quoted strings (""" or ''')
    pattern_triple = r'pyautogui\.(write|typewrite)\((?:"""((?:[^"]|"(?!""))*?)"""|\'\'\'((?:[^\']|\'(?!\'\'))*?)\'\'\')(?:,\s*(.+?))?\)'
    # Pattern for single/double-quoted strings
    pattern_single = r'pyautogui\.(write|typewrite)\(([\"\'])((?:[^\"\'\\]|\\.)*?)\2(?:,\s*(.+?))?\)'

    # Helper function to normalize match groups for triple-quoted strings
    def replace_triple(match):
        method = match.group(1)
        text = match.group(2) if match.group(2) is not None else match.group(3)  # """ or '''
        extra_args = match.group(4)
        # Create a normalized match object
        class NormalizedMatch:
            def __init__(self, original, method, text, extra_args):
                self._original = original
                self._groups = (original, method, text, extra_args)
            def group(self, n):
                return self._groups[n]
        return replace_non_ascii_write(NormalizedMatch(match.group(0), method, text, extra_args))

    # Helper function for single/double-quoted strings
    def replace_single(match):
        method = match.group(1)
        quote_char = match.group(2)
        text = match.group(3)
        extra_args = match.group(4)
        class NormalizedMatch:
            def __init__(self, original, method, text, extra_args):
                self._original = original
                self._groups = (original, method, text, extra_args)
            def group(self, n):
                return self._groups[n]
        return replace_non_ascii_write(NormalizedMatch(match.group(0), method, text, extra_args))

    # First replace triple-quoted strings, then single/double-quoted strings
    command = re.sub(pattern_triple, replace_triple, command, flags=re.DOTALL)
    command = re.sub(pattern_single, replace_single, command)

    return command


def rewrite_upstream(command: str) -> str:
    return _fix_pyautogui_less_than_bug(command)


def rewrite_jp(command: str) -> str:
    return _fix_pyautogui_non_ascii(_fix_pyautogui_less_than_bug_jp(command))


class DesktopEnv:
    """DesktopEnv.step / evaluate with the VM behind ``execute_python_command`` (a callable)."""

    def __init__(self, execute_python_command, rewrite=rewrite_upstream, infeasible=False, metric=lambda: 1.0):
        self.execute_python_command = execute_python_command
        self.rewrite = rewrite
        self.evaluator = {"func": "infeasible" if infeasible else "checker"}
        self.metric = metric
        self.action_history = []
        self._step_no = 0

    def step(self, action, pause=2):
        self._step_no += 1
        self.action_history.append(action)
        reward = 0  # todo: Define reward calculation for each example
        done = False  # todo: Define episode termination condition for each example
        info = {}
        # handle the special actions
        if action in ['WAIT', 'FAIL', 'DONE'] or (type(action) == dict and action['action_type'] in ['WAIT', 'FAIL', 'DONE']):
            if action == 'WAIT':
                pass  # pinned: time.sleep(pause)
            elif action == 'FAIL':
                done = True
                info = {"fail": True}
            elif action == 'DONE':
                done = True
                info = {"done": True}
        if action in ['WAIT', 'FAIL', 'DONE']:
            pass  # pinned: self.controller.execute_action(action)
        elif type(action) == str:
            self.execute_python_command(self.rewrite(action))
        return {"screenshot": None}, reward, done, info  # pinned: time.sleep(pause); self._get_obs()

    def evaluate(self):
        if self.evaluator['func'] == "infeasible":
            if len(self.action_history) > 0 and self.action_history[-1] == "FAIL":
                return 1
            else:
                return 0
        else:
            if len(self.action_history) > 0 and self.action_history[-1] == "FAIL":
                return 0
        return self.metric()  # pinned: the metric / getter plumbing


def run_single_example(agent, env, example, max_steps, instruction, args, example_result_dir, scores, obs):
    # pinned: runtime_logger = setup_logger(example, example_result_dir)
    try:
        agent.reset(None)  # pinned: agent.reset(runtime_logger)
    except Exception as e:
        agent.reset()

    # pinned: env.reset(task_config=example); time.sleep(60); obs = env._get_obs() -> obs passed in
    done = False
    step_idx = 0
    # pinned: env.controller.start_recording()
    while not done and step_idx < max_steps:
        # Try to get 3 values (new format with info_dict), fall back to 2 values (old format)
        predict_result = agent.predict(instruction, obs)
        if len(predict_result) == 3:
            response, actions, info_dict = predict_result
        else:
            response, actions = predict_result
            info_dict = {}

        for action in actions:
            _, reward, done, info = env.step(action, args.sleep_after_execution)  # pinned: obs kept
            # pinned: screenshot and traj.jsonl writing left out
            if done:
                break
        step_idx += 1
    # pinned: time.sleep(20)
    result = env.evaluate()
    scores.append(result)
    return step_idx
