"""Compares two junit XML files of the torch conformance suite: which tests each backend passes."""
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        if case.find("failure") is not None or case.find("error") is not None:
            result[name] = "fail"
        elif case.find("skipped") is not None:
            result[name] = "skip"
        else:
            result[name] = "pass"
    return result


def main(hoccl_xml, gloo_xml):
    h, g = outcomes(hoccl_xml), outcomes(gloo_xml)
    gloo_pass = {n for n, o in g.items() if o == "pass"}
    both = sorted(n for n in gloo_pass if h.get(n) == "pass")
    missing = sorted(n for n in gloo_pass if h.get(n) != "pass")
    extra = sorted(n for n, o in h.items() if o == "pass" and n not in gloo_pass)
    print(f"# torch distributed_test.py, 2 ranks, CPU\n")
    print(f"- gloo passes {len(gloo_pass)} tests; hoccl passes {len(both)} of them "
          f"({len([n for n, o in h.items() if o == 'pass'])} in all, {len(extra)} that gloo does not)")
    print(f"- gloo-passing tests hoccl does not pass: {len(missing)}\n")
    for n in missing:
        print(f"  - {n}: {h.get(n, 'not run')}")
    print("\n## passed by hoccl\n")
    for n in sorted(n for n, o in h.items() if o == "pass"):
        print(f"- {n}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
